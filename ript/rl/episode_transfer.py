"""A round's recorded episodes as they cross from a rollout actor to its trainer (``placement.mode=disaggregated``).

Each recorded decision holds a few small tensors on the actor's GPU (its context, tokens, log-probs, ...). Sent as
they are, a round of 256 episodes is tens of thousands of tensors, each serialised on its own with a device-to-host
copy, then rebuilt one by one on the trainer's device: seconds per round, during which no simulator runs. Packed,
each episode's decisions travel as one host tensor per field, and the trainer takes them apart into the same
decisions, bit for bit.
"""

from __future__ import annotations

import torch


def pack_episodes(results: dict) -> dict:
    """``results`` with each episode's ``decisions`` replaced by ``packed_decisions``."""
    episodes = [{**{k: v for k, v in e.items() if k != "decisions"}, "packed_decisions": pack(e["decisions"])}
                if "decisions" in e else e for e in results["episodes"]]
    return {**results, "episodes": episodes}


def unpack_episodes(results: dict, device: str) -> dict:
    """``pack_episodes`` undone: each episode's decisions again, their tensors that were on a GPU on ``device``."""
    episodes = [{**{k: v for k, v in e.items() if k != "packed_decisions"},
                 "decisions": unpack(e["packed_decisions"], device)} if "packed_decisions" in e else e
                for e in results["episodes"]]
    return {**results, "episodes": episodes}


def pack(decisions: list[dict]) -> dict:
    """The fields every decision holds as tensors of one shape and dtype (also inside a dict such as ``obs``),
    stacked on the host; the other fields (a prompt, a task index, the last decision's bootstrap value) as they
    are, decision by decision."""
    stacked: dict[str, dict] = {}
    for name in decisions[0] if decisions else ():
        values = [d.get(name) for d in decisions]
        if all(isinstance(v, dict) and v.keys() == values[0].keys() for v in values):
            parts = {k: _stacked([v[k] for v in values]) for k in values[0]}
            if all(p is not None for p in parts.values()):
                stacked[name] = {"dict": parts}
                continue
        part = _stacked(values)
        if part is not None:
            stacked[name] = part
    rest = [{k: v for k, v in d.items() if k not in stacked} for d in decisions]
    return {"count": len(decisions), "stacked": stacked, "rest": rest}


def unpack(packed: dict, device: str) -> list[dict]:
    decisions = [dict(rest) for rest in packed["rest"]]
    for name, part in packed["stacked"].items():
        if "dict" in part:
            columns = {k: _columns(p, device) for k, p in part["dict"].items()}
            for i, decision in enumerate(decisions):
                decision[name] = {k: column[i] for k, column in columns.items()}
        else:
            for decision, value in zip(decisions, _columns(part, device)):
                decision[name] = value
    return decisions


def _stacked(values: list) -> dict | None:
    """The tensors ``values`` as one host tensor and the device type they were on (None: not all tensors of one
    shape, dtype and device)."""
    first = values[0]
    if not all(isinstance(v, torch.Tensor) and v.shape == first.shape and v.dtype == first.dtype
               and v.device == first.device for v in values):
        return None
    return {"tensor": torch.stack(values).cpu(), "on_gpu": first.device.type == "cuda"}


def _columns(part: dict, device: str) -> list[torch.Tensor]:
    tensor = part["tensor"].to(device) if part["on_gpu"] and device.startswith("cuda") else part["tensor"]
    return list(tensor.unbind(0))
