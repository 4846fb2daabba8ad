"""A model's weights from one process to others over a torch.distributed group (NCCL between GPUs, gloo on CPUs):
the trainer's weights to the processes that roll out with them, when they are not the same processes.

Before any tensor moves, every rank's signature (each parameter's and buffer's name, shape and dtype, in
``state_dict`` order) is gathered, and a rank whose model differs from the sender's makes every rank raise the
same one-line error: no rank is left waiting in a broadcast its peers will never join. The tensors then travel
as one flat buffer per dtype and device, and, with ``verify``, each rank checks that the sums of what it received
equal the sender's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ript.errors import RiptError
from ript.utils.fsdp import whole


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str


def signature(module: torch.nn.Module) -> list[TensorSpec]:
    """Each tensor of the module's state (parameters and buffers), as it would travel."""
    return [TensorSpec(name, tuple(t.shape), str(t.dtype)) for name, t in module.state_dict(keep_vars=True).items()]


def first_difference(sent: list[TensorSpec], held: list[TensorSpec]) -> str | None:
    """How a receiver's signature differs from the sender's (the first difference, said in one line), or None."""
    held_by_name, sent_names = {s.name: s for s in held}, {s.name for s in sent}
    for spec in sent:
        mine = held_by_name.get(spec.name)
        if mine is None:
            return f"has no tensor {spec.name} ({spec.dtype} {list(spec.shape)})"
        if mine.shape != spec.shape or mine.dtype != spec.dtype:
            return (f"holds {spec.name} as {mine.dtype} {list(mine.shape)}, the sender as {spec.dtype} "
                    f"{list(spec.shape)}")
    extra = [s.name for s in held if s.name not in sent_names]
    if extra:
        return f"has tensors the sender does not: {', '.join(extra[:3])}{' ...' if len(extra) > 3 else ''}"
    if [s.name for s in held] != [s.name for s in sent]:
        return "holds the same tensors in another order"
    return None


def check_signatures(module: torch.nn.Module, src: int, group=None) -> None:
    """Gather every rank's signature; raise the same RiptError on every rank if any differs from rank ``src``'s."""
    signatures: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(signatures, signature(module), group=group)
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(len(signatures)))
    sent = signatures[ranks.index(src)]
    for rank, held in zip(ranks, signatures):
        problem = first_difference(sent, held)
        if problem is not None:
            raise RiptError(f"weight sync: rank {rank} {problem} (rank {src} sends); both sides must build the "
                            f"same model")


def sync_weights(module: torch.nn.Module, src: int, group=None, verify: bool = False) -> int:
    """Every rank of ``group`` calls this: rank ``src``'s weights are copied into the other ranks' ``module`` in
    place. Returns the bytes sent (per receiver)."""
    check_signatures(module, src, group)
    tensors = list(module.state_dict(keep_vars=True).values())
    buckets: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for t in tensors:
        buckets.setdefault((t.dtype, t.device), []).append(t)
    sent = 0
    with torch.no_grad():
        for (dtype, _device), members in buckets.items():
            flat = torch.cat([t.detach().reshape(-1) for t in members])
            dist.broadcast(flat, src, group=group)
            if dist.get_rank() != src:
                for t, part in zip(members, flat.split([t.numel() for t in members])):
                    t.detach().copy_(part.view_as(t))
            if verify:
                _check_sum(flat, src, group, dtype)
            sent += flat.numel() * flat.element_size()
    return sent


def _check_sum(flat: torch.Tensor, src: int, group, dtype: torch.dtype) -> None:
    """Does what every rank holds now sum to what the sender sent? Every rank sees every rank's sum, so all of them
    raise the same error or none does."""
    total = float(flat.double().sum()) if flat.is_floating_point() else float(flat.long().sum())
    totals: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(totals, (dist.get_rank(), total), group=group)
    reference = next(t for r, t in totals if r == src)
    wrong = [(r, t) for r, t in totals if t != reference]
    if wrong:
        rank, got = wrong[0]
        raise RiptError(f"weight sync: the {dtype} weights rank {rank} received sum to {got!r}, rank {src} sent "
                        f"{reference!r}")


class WeightChannel:
    """A sender (rank 0) and one receiver (rank 1) joined by a TCP store and a gloo group of their own, beside
    any torch.distributed group either process is in (a torchrun rank and the Ray actor that rolls out for it).
    Tensors travel through host memory as one flat buffer per dtype. On the first transfer the receiver compares
    the sender's signature with its own, through the store, before any tensor moves; a difference is the same
    one-line error on both sides.

    The sender opens the store (``listen``) and passes its port to the receiver; both then build the channel,
    which returns once both have joined."""

    def __init__(self, store: dist.TCPStore, rank: int, timeout_s: float = 300.0):
        from datetime import timedelta

        self.store, self.rank = store, rank
        self.group = dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=timeout_s))
        self.checked = False

    @staticmethod
    def listen(host: str, timeout_s: float = 300.0) -> dist.TCPStore:
        """The sender's store, on a free port of ``host`` (``store.port``)."""
        from datetime import timedelta

        return dist.TCPStore(host, 0, 2, is_master=True, timeout=timedelta(seconds=timeout_s),
                             wait_for_workers=False)

    @staticmethod
    def connect(host: str, port: int, timeout_s: float = 300.0) -> dist.TCPStore:
        from datetime import timedelta

        return dist.TCPStore(host, port, 2, is_master=False, timeout=timedelta(seconds=timeout_s))

    def transfer(self, module: torch.nn.Module) -> int:
        """Both sides call this with their copy: the receiver's ``module`` ends with the sender's tensors. Returns
        the bytes sent."""
        if not self.checked:
            self._check(module)
            self.checked = True
        buckets: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in module.state_dict(keep_vars=True).values():
            buckets.setdefault(t.dtype, []).append(t)
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        sent = 0
        with torch.no_grad():
            for members in buckets.values():
                # a sender sharded with FSDP gathers each tensor whole (a collective of its own ranks, in one order)
                flat = torch.cat([whole(t).detach().reshape(-1).cpu() for t in members])
                self.group.broadcast([flat], opts).wait()
                if self.rank == 1:
                    for t, part in zip(members, flat.split([t.numel() for t in members])):
                        t.detach().copy_(part.view_as(t))
                sent += flat.numel() * flat.element_size()
        return sent

    def _check(self, module: torch.nn.Module) -> None:
        import pickle

        if self.rank == 0:
            self.store.set("signature", pickle.dumps(signature(module)))
            problem = self.store.get("verdict").decode()
        else:
            problem = first_difference(pickle.loads(self.store.get("signature")), signature(module)) or ""
            self.store.set("verdict", problem)
        if problem:
            raise RiptError(f"weight sync: the receiving side {problem}; both sides must build the same model")
