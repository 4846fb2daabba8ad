"""torch.distributed helpers: the same code runs alone or under torchrun (one process per GPU or CPU slot)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ript.errors import RiptError
from ript.utils.device import resolve_device
from ript.utils.logging import log
from ript.utils.processes import ranks_on_this_host, stacks_when_stopped, usable_cores


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1  # ranks on this host, sharing its cores

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def cores_per_rank(self) -> int:
        """This rank's share of the host's cores: what an "auto" count of env workers means, so that the ranks on
        one host do not each start a worker per core (the simulator is CPU-bound)."""
        return max(1, usable_cores() // self.local_world_size)


def init_rank(device: str) -> tuple[str, DistInfo]:
    """This process's device and place in the group torchrun describes (alone: rank 0 of 1). Every entry point
    calls it before building anything, so under torchrun each rank builds on cuda:<local rank>, and NCCL is
    told that device (no guessing the rank-to-GPU mapping); the rank's env workers render on that GPU too
    (``ript.envs.gl.worker_render_gpus``)."""
    device = resolve_device(device)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return device, DistInfo()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    stacks_when_stopped()
    if device == "cuda":
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    if int(os.environ.get("RANK", "0")) != 0:
        log.setLevel("WARNING")  # rank 0 reports progress; the others only their warnings and errors
    if not dist.is_initialized():
        if device.startswith("cuda"):
            dist.init_process_group("nccl", device_id=torch.device(device))
        else:
            dist.init_process_group("gloo")
    return device, DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, ranks_on_this_host())


def batch_share(batch_size: int, info: DistInfo) -> slice:
    """This rank's contiguous block of a global batch (equal blocks, so averaged gradients equal the gradient
    of the global batch's mean loss)."""
    if batch_size % info.world_size:
        raise RiptError(f"train.batch_size={batch_size} is not divisible by the {info.world_size} processes; "
                        f"it is the global batch, split evenly over ranks")
    per_rank = batch_size // info.world_size
    return slice(info.rank * per_rank, (info.rank + 1) * per_rank)


def gather_objects(obj, info: DistInfo) -> list:
    """Every rank's ``obj``, in rank order (alone: ``[obj]``)."""
    if info.world_size == 1:
        return [obj]
    out = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def any_rank(flag: bool, info: DistInfo) -> bool:
    """True on every rank when any rank says so (e.g. one rank's clock ran out: all stop at the same step)."""
    return all_sum([float(flag)], info)[0] > 0


def all_sum(values: list[float], info: DistInfo, group=None) -> list[float]:
    """Sum a few scalars over ranks (one collective; ``group``: a process group other than the default)."""
    return _all_reduce(values, info, dist.ReduceOp.SUM, group)


def all_max(values: list[float], info: DistInfo) -> list[float]:
    """The largest of a few scalars over ranks (one collective)."""
    return _all_reduce(values, info, dist.ReduceOp.MAX)


def _all_reduce(values: list[float], info: DistInfo, op, group=None) -> list[float]:
    if info.world_size == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64)
    if dist.get_backend(group) == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=op, group=group)
    return t.cpu().tolist()


def side_group(info: DistInfo):
    """A gloo group of every rank beside the default one (every rank calls this, in the same order), for
    collectives a thread makes while the main thread makes its own (None alone)."""
    return dist.new_group(backend="gloo") if info.world_size > 1 else None


def average_gradients(params: list[torch.nn.Parameter], info: DistInfo, weight: torch.Tensor | None = None) -> None:
    """Average gradients over ranks in one flat all-reduce (every rank calls this the same number of times).
    ``weight``: this rank's part of the global loss's normaliser (e.g. its count of unmasked elements), so the
    ranks' gradients of their own means combine into the gradient of the global batch's mean."""
    if info.world_size == 1 or not params:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    if weight is None:
        dist.all_reduce(flat)
        flat /= info.world_size
    else:
        w = weight.detach().to(flat.dtype).reshape(1)
        flat = torch.cat([flat * w, w])
        dist.all_reduce(flat)
        flat = flat[:-1] / flat[-1]
    offset = 0
    for p, g in zip(params, grads):
        n = g.numel()
        g.copy_(flat[offset: offset + n].view(g.shape))  # in place: keeps the gradient's memory format
        p.grad = g
        offset += n


def barrier(info: DistInfo) -> None:
    if info.world_size > 1:
        dist.barrier()


def shutdown(info: DistInfo) -> None:
    if info.world_size > 1 and dist.is_initialized():
        dist.destroy_process_group()
