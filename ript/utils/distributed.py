"""torch.distributed helpers: the same code runs alone or under torchrun (one process per GPU or CPU slot)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str) -> DistInfo:
    """Join the process group torchrun describes in the environment; alone, do nothing."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return DistInfo()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def all_sum(values: list[float], info: DistInfo) -> list[float]:
    """Sum a few scalars over ranks (one collective)."""
    if info.world_size == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    return t.cpu().tolist()


def average_gradients(params: list[torch.nn.Parameter], info: DistInfo) -> None:
    """Average gradients over ranks in one flat all-reduce (every rank calls this the same number of times)."""
    if info.world_size == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= info.world_size
    offset = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = flat[offset: offset + n].view_as(p).clone()
        offset += n


def barrier(info: DistInfo) -> None:
    if info.world_size > 1:
        dist.barrier()


def shutdown(info: DistInfo) -> None:
    if info.world_size > 1 and dist.is_initialized():
        dist.destroy_process_group()
