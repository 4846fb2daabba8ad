"""One registry for every named, swappable part (models, advantage estimators, ...)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ript.errors import RiptError


class Registry:
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Callable[..., Any]] = {}

    def register(self, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def deco(obj: Callable[..., Any]) -> Callable[..., Any]:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._entries[name] = obj
            return obj

        return deco

    def get(self, name: str) -> Callable[..., Any]:
        if name not in self._entries:
            raise RiptError(f"unknown {self.kind} {name!r}; registered: {', '.join(self.names())}")
        return self._entries[name]

    def build(self, name: str, **kwargs: Any) -> Any:
        return self.get(name)(**kwargs)

    def names(self) -> list[str]:
        return sorted(self._entries)


MODELS = Registry("model")
ADVANTAGES = Registry("advantage estimator")
POLICIES = Registry("policy family")
EXPERTS = Registry("scripted expert")
ENVIRONMENTS = Registry("RL environment")
WORKER_POOLS = Registry("env worker backend")
PLACEMENTS = Registry("rollout placement")
