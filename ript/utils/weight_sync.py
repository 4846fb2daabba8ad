"""A model's weights from the trainer to the process that rolls out with them (a torchrun rank and its Ray
rollout actor), over a two-process torch.distributed group of their own: NCCL where both sides hold the weights on
GPUs of their own, gloo through host memory otherwise.

Before the first tensor moves, the receiver compares the sender's signature (each parameter's and buffer's name,
shape and dtype, in ``state_dict`` order) with its own, through the store that joined them; a difference is the
same one-line error on both sides, so neither is left waiting in a broadcast the other will never join. The tensors
then travel as flat buffers of one dtype and at most ``bucket_bytes`` each, so a 7B model never needs a second
whole copy on either side.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ript.errors import RiptError
from ript.utils.fsdp import whole

BACKENDS = ("auto", "gloo", "nccl")
BUCKET_BYTES = 256 * 2**20


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


@dataclass(frozen=True)
class Endpoint:
    """Where one side of the channel holds its weights: the node and the host's number of its GPU (None: CPU)."""
    node: str
    gpu: int | None


def channel_backend(setting: str, sender: Endpoint, receiver: Endpoint) -> str:
    """``placement.weight_backend`` made concrete: NCCL needs both sides on GPUs, and two GPUs (NCCL refuses two
    ranks of one group on the same device, as a rollout actor given a share of its trainer's GPU would be)."""
    if setting not in BACKENDS:
        raise RiptError(f"placement.weight_backend={setting}: one of {', '.join(BACKENDS)}")
    on_gpus = sender.gpu is not None and receiver.gpu is not None
    apart = on_gpus and sender != receiver
    if setting == "nccl" and not apart:
        where = "the same GPU" if on_gpus else "the CPU"
        raise RiptError(f"placement.weight_backend=nccl: the trainer and its rollout actor hold the weights on "
                        f"{where}; NCCL needs a GPU of each (placement.rollout_gpus=1), else use gloo or auto")
    if setting == "auto":
        return "nccl" if apart else "gloo"
    return setting


def buckets(tensors: list[torch.Tensor], bucket_bytes: int) -> list[list[torch.Tensor]]:
    """The tensors in travel order, grouped by dtype into runs of at most ``bucket_bytes`` (a bigger tensor goes
    alone)."""
    by_dtype: dict[torch.dtype, list[list[torch.Tensor]]] = {}
    filled: dict[torch.dtype, int] = {}  # the bytes in each dtype's last run
    for t in tensors:
        runs = by_dtype.setdefault(t.dtype, [[]])
        size = t.numel() * t.element_size()
        if runs[-1] and filled[t.dtype] + size > bucket_bytes:
            runs.append([])
            filled[t.dtype] = 0
        runs[-1].append(t)
        filled[t.dtype] = filled.get(t.dtype, 0) + size
    return [run for runs in by_dtype.values() for run in runs if run]


class WeightChannel:
    """A sender (rank 0) and one receiver (rank 1) joined by a TCP store and a process group of their own, beside
    any torch.distributed group either process is in. ``device`` is where this side's weights live: the buffers
    travel there (NCCL) or through host memory (gloo).

    The sender opens the store (``listen``) and passes its port to the receiver; both then build the channel with
    the same backend."""

    def __init__(self, store: dist.TCPStore, rank: int, timeout_s: float = 300.0, backend: str = "gloo",
                 device: torch.device | str = "cpu", bucket_bytes: int = BUCKET_BYTES):
        self.rank, self.backend, self.bucket_bytes = rank, backend, bucket_bytes
        self.prefixed = prefixed = dist.PrefixStore(f"weights_{backend}", store)
        if backend == "nccl":
            self.device = torch.device(device)
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timedelta(seconds=timeout_s)
            self.group = dist.ProcessGroupNCCL(prefixed, rank, 2, options)
        else:
            self.device = torch.device("cpu")
            self.group = dist.ProcessGroupGloo(prefixed, rank, 2, timedelta(seconds=timeout_s))
        self.checked = False

    @staticmethod
    def listen(host: str, timeout_s: float = 300.0) -> dist.TCPStore:
        """The sender's store, on a free port of ``host`` (``store.port``)."""
        return dist.TCPStore(host, 0, 2, is_master=True, timeout=timedelta(seconds=timeout_s),
                             wait_for_workers=False)

    @staticmethod
    def connect(host: str, port: int, timeout_s: float = 300.0) -> dist.TCPStore:
        return dist.TCPStore(host, port, 2, is_master=False, timeout=timedelta(seconds=timeout_s))

    def transfer(self, module: torch.nn.Module) -> int:
        """Both sides call this with their copy: the receiver's ``module`` ends with the sender's tensors. Returns
        the bytes sent."""
        if not self.checked:
            self._check(module)
            self.checked = True
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        sent = 0
        with torch.no_grad():
            for members in buckets(list(module.state_dict(keep_vars=True).values()), self.bucket_bytes):
                # a sender sharded with FSDP gathers each tensor whole (a collective of its own ranks, in one order)
                flat = torch.cat([whole(t).detach().reshape(-1).to(self.device) for t in members])
                self.group.broadcast([flat], opts).wait()
                if self.rank == 1:
                    for t, part in zip(members, flat.split([t.numel() for t in members])):
                        t.detach().copy_(part.view_as(t))
                sent += flat.numel() * flat.element_size()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the weights are in place before anything acts with them
        return sent

    def _check(self, module: torch.nn.Module) -> None:
        if self.rank == 0:
            self.prefixed.set("signature", pickle.dumps(signature(module)))
            problem = self.prefixed.get("verdict").decode()
        else:
            problem = first_difference(pickle.loads(self.prefixed.get("signature")), signature(module)) or ""
            self.prefixed.set("verdict", problem)
        if problem:
            raise RiptError(f"weight sync: the receiving side {problem}; both sides must build the same model")
