"""FSDP (torch's ``fully_shard``) for training policies too large to hold whole on every GPU: each rank keeps a
shard of every layer's parameters, gradients and optimizer state, and gathers a layer's weights for its forward
and backward. Gradients leave the backward already averaged over ranks, so the update all-reduces only what is not
sharded (a critic). A sharded model must run its forwards on every rank in step, so its rollouts need a whole
copy elsewhere (a rollout actor, ``placement.mode=disaggregated``), and what is written or sent is gathered whole
first, so that it loads on any number of ranks.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor


def shard_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The layers sharded one by one: the members of every stack of layers (a ``ModuleList`` of two or more),
    outermost stacks first (a layer inside an already chosen one is not chosen again)."""
    units: list[torch.nn.Module] = []
    inside: set[int] = set()
    for _, module in model.named_modules():
        if id(module) in inside or not isinstance(module, torch.nn.ModuleList) or len(module) < 2:
            continue
        for layer in module:
            if any(True for _ in layer.parameters()):
                units.append(layer)
                inside.update(id(m) for m in layer.modules())
    return units


def shard_model(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Shard ``model`` over the default process group: each stack member, then the rest at the root. Sharding
    replaces the parameters; returns the new ones in ``model.parameters()`` order."""
    from torch.distributed.fsdp import fully_shard

    for unit in shard_units(model):
        fully_shard(unit)
    fully_shard(model)
    return list(model.parameters())


def same_parameters(model: torch.nn.Module, before: list[torch.nn.Parameter],
                    names_before: dict[int, str]) -> list[torch.nn.Parameter]:
    """The parameters that replaced ``before`` (a list of the model's parameters taken before sharding), by name."""
    now = dict(model.named_parameters())
    return [now[names_before[id(p)]] for p in before]


def whole(t: torch.Tensor) -> torch.Tensor:
    """A sharded tensor gathered whole (a collective: every rank calls it), anything else as it is."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def whole_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict with every sharded tensor gathered whole, on the host (every rank calls it, in one order)."""
    return {k: whole(v).detach().cpu() for k, v in state.items()}
