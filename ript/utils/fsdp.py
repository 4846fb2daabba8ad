"""FSDP (torch's ``fully_shard``) for training policies too large to hold whole on every GPU: each rank keeps a
shard of every layer's parameters, gradients and optimizer state, and gathers a layer's weights for its forward
and backward. Gradients leave the backward already averaged over ranks, so the update all-reduces only what is not
sharded (a critic). A sharded model must run its forwards on every rank in step, so its rollouts need a whole
copy elsewhere (a rollout actor, ``placement.mode=disaggregated``), and what is written or sent is gathered whole
first, so that it loads on any number of ranks.
"""

from __future__ import annotations

import sys

import torch

from ript.errors import RiptError


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


def part_units(model: torch.nn.Module, units: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """The modules outside ``units``, other than the root, that hold weights of their own (an embedding, a
    projection, a norm): each is a unit of its own, gathered around its own ``forward`` and, for its backward, by
    hooks on its own outputs. Weights the root held would be gathered around a method the root runs several
    times a step (π0's ``expert``, once per denoise step) and freed once the gradient reached any one call's
    inputs, whatever the backward of the others still needed; and a module holding both its own weights and
    units may never run its ``forward`` (a language model whose layers the policy runs itself). A module whose
    own weights are of two dtypes (FSDP shards one dtype per unit) is an error naming one."""
    inside = {id(p) for unit in units for p in unit.parameters()}
    holders: dict[int, int] = {}  # a weight two modules hold (tied) stays with the root, their common unit
    for module in model.modules():
        for p in module.parameters(recurse=False):
            holders[id(p)] = holders.get(id(p), 0) + 1
    chosen: list[torch.nn.Module] = []
    for name, module in model.named_modules():
        own = [(f"{name}.{n}", p) for n, p in module.named_parameters(recurse=False) if id(p) not in inside]
        if module is model or not own or any(holders[id(p)] > 1 for _, p in own):
            continue
        one_dtype(own)
        chosen.append(module)
        inside.update(id(p) for _, p in own)
    one_dtype([(name, p) for name, p in model.named_parameters() if id(p) not in inside])  # the root's
    return chosen[::-1]  # a module holding weights of its own inside another such is sharded before it


def one_dtype(weights: list[tuple[str, torch.nn.Parameter]]) -> None:
    """The weights of one unit are of one dtype, else an error naming the smallest of another."""
    dtypes = {p.dtype for _, p in weights}
    if len(dtypes) > 1:
        stray, p = min(weights, key=lambda item: item[1].numel())
        raise RiptError(f"{stray}: {p.dtype} beside {(dtypes - {p.dtype}).pop()} weights in one module; FSDP "
                        "shards one dtype per module")


def shard_model(model: torch.nn.Module, methods: tuple[str, ...] = (),
                layer_methods: tuple[str, ...] = ()) -> list[torch.nn.Parameter]:
    """Shard ``model`` over the default process group: each stack member, each part outside the stacks, then the
    root (its own weights). Sharding replaces the parameters; returns the new ones in ``model.parameters()``
    order. The root's weights are gathered around its ``forward`` and around each of ``methods`` (the others a
    caller runs on it directly); a layer's around its ``forward`` and each of ``layer_methods`` it has (those the
    model runs its layers by)."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    model.to(memory_format=torch.contiguous_format)  # FSDP shards only contiguous weights (not channels_last convs)
    units = shard_units(model)
    for unit in units + part_units(model, units):
        fully_shard(unit)
        # the stacks of one model are of several kinds (a vision tower's layers beside a language model's)
        for name in (name for name in layer_methods if callable(getattr(unit, name, None))):
            register_fsdp_forward_method(unit, name)
    fully_shard(model)
    for name in methods:
        register_fsdp_forward_method(model, name)
    return list(model.parameters())


def same_parameters(model: torch.nn.Module, before: list[torch.nn.Parameter],
                    names_before: dict[int, str]) -> list[torch.nn.Parameter]:
    """The parameters that replaced ``before`` (a list of the model's parameters taken before sharding), by name."""
    now = dict(model.named_parameters())
    return [now[names_before[id(p)]] for p in before]


def sharded(t: torch.Tensor) -> bool:
    """Whether ``t`` is a DTensor. Torch's DTensor module is imported by sharding (``fully_shard``), not here: it
    takes most of a second, which every job would pay at start, and no tensor is sharded before it is loaded."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and isinstance(t, dtensor.DTensor)


def whole(t: torch.Tensor) -> torch.Tensor:
    """A sharded tensor gathered whole (a collective: every rank calls it), anything else as it is."""
    return t.full_tensor() if sharded(t) else t


def whole_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict with every sharded tensor gathered whole, on the host (every rank calls it, in one order)."""
    return {k: whole(v).detach().cpu() for k, v in state.items()}


def shard_like(own: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """``full`` (a whole tensor of ``own``'s global shape) as ``own`` holds it: this rank's shard where ``own`` is
    sharded, else ``full`` itself."""
    if not sharded(own):
        return full
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(full.to(own.device, own.dtype), own.device_mesh, own.placements)


class WholeState:
    """How checkpoints read and write a model held whole on each rank: rank 0 writes its own copy."""

    def weights(self, module: torch.nn.Module, main: bool) -> dict[str, torch.Tensor] | None:
        """The state to write (None: the writer takes the module's own), on rank 0."""
        return None

    def optimizer(self, opt: torch.optim.Optimizer, main: bool) -> dict | None:
        return opt.state_dict() if main else None

    def load_weights(self, module: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``state`` as ``module`` takes it."""
        return state

    def load_optimizer(self, opt: torch.optim.Optimizer, state: dict) -> None:
        opt.load_state_dict(state)


class ShardedState(WholeState):
    """How checkpoints read and write a model sharded with FSDP: every rank gathers the weights and the
    optimizer's moments whole (collectives, in one order), rank 0 writes them, and a resume shards them again on
    however many ranks it runs."""

    def weights(self, module: torch.nn.Module, main: bool) -> dict[str, torch.Tensor] | None:
        state = whole_state(module.state_dict())
        return {k: v.contiguous() for k, v in state.items()} if main else None

    def optimizer(self, opt: torch.optim.Optimizer, main: bool) -> dict | None:
        state = opt.state_dict()
        moments = {i: {k: whole(v).detach().cpu() for k, v in sorted(per.items())}
                   for i, per in sorted(state["state"].items())}
        return {"state": moments, "param_groups": state["param_groups"]} if main else None

    def load_weights(self, module: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        own = module.state_dict()
        return {k: shard_like(own[k], v) if k in own and own[k].shape == v.shape else v for k, v in state.items()}

    def load_optimizer(self, opt: torch.optim.Optimizer, state: dict) -> None:
        params = [p for group in opt.param_groups for p in group["params"]]
        moments = {i: {k: shard_like(params[i], v) if torch.is_tensor(v) and v.shape == params[i].shape else v
                       for k, v in per.items()} for i, per in state["state"].items()}
        opt.load_state_dict({"state": moments, "param_groups": state["param_groups"]})
