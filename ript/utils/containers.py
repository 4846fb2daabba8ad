"""Composed configs as plain containers (what JSON files and loggers take)."""

from __future__ import annotations

from typing import Any


def to_dict(cfg) -> dict[str, Any]:
    """An OmegaConf config, interpolations resolved, as nested dicts and lists."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
