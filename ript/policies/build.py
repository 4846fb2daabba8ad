"""Policies from checkpoints: the sampling settings a checkpoint records, and the chunk policy built on them."""

from __future__ import annotations

from typing import Any

from ript.errors import RiptError
from ript.policies.chunk_policy import ChunkPolicy


def sampling_settings(metadata: dict, overrides: dict | None = None, legacy_cfg: dict | None = None) -> dict[str, Any]:
    """A checkpoint's sampling settings (stage 1 records them, RL the ones it trained with), non-null overrides
    applied. ``legacy_cfg`` (the checkpoint's config) serves checkpoints written before they were recorded."""
    out = metadata.get("sampling")
    if out is None:
        if legacy_cfg is None:
            raise RiptError("checkpoint metadata has no sampling settings (metadata.sampling)")
        out = stage1_sampling(legacy_cfg["algo"])
    return with_overrides(out, overrides)


def with_overrides(settings: dict, overrides: dict | None) -> dict[str, Any]:
    """``settings`` with the non-null ``overrides`` applied (a null key keeps the setting)."""
    return {**settings, **{k: v for k, v in (overrides or {}).items() if v is not None}}


def stage1_sampling(algo_cfg) -> dict[str, Any]:
    """The sampling settings a stage-1 (or finetune) checkpoint records: its algo's action horizon and sampling."""
    return {"action_horizon": int(algo_cfg["action_horizon"]), **dict(algo_cfg["sampling"])}


def make_policy(model, settings: dict, device: str, seed: int, cuda_graph: bool = True) -> ChunkPolicy:
    return ChunkPolicy(model, action_horizon=int(settings["action_horizon"]),
                       temperature=float(settings["temperature"]),
                       top_k=settings.get("top_k"), greedy=bool(settings.get("greedy", False)), device=device,
                       seed=seed, amp=device.startswith("cuda"), cuda_graph=cuda_graph)
