"""One registry for every named, swappable part (models, advantage estimators, ...)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from ript.errors import RiptError


class Registry:
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Callable[..., Any]] = {}
        self._modules: dict[str, str] = {}  # name -> the module that registers it when imported (``declare``)

    def declare(self, modules: dict[str, str]) -> None:
        """Names whose modules are imported only when the name is first asked for: a part that brings heavy
        libraries (transformers for the VLA models) costs nothing to the jobs that never use it."""
        self._modules.update(modules)

    def register(self, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def deco(obj: Callable[..., Any]) -> Callable[..., Any]:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._entries[name] = obj
            return obj

        return deco

    def get(self, name: str) -> Callable[..., Any]:
        if name not in self._entries and name in self._modules:
            importlib.import_module(self._modules[name])
            if name not in self._entries:
                raise ValueError(f"{self.kind} {name!r}: its module {self._modules[name]} registers no such name")
        if name not in self._entries:
            raise RiptError(f"unknown {self.kind} {name!r}; registered: {', '.join(self.names())}")
        return self._entries[name]

    def build(self, name: str, **kwargs: Any) -> Any:
        return self.get(name)(**kwargs)

    def names(self) -> list[str]:
        return sorted({*self._entries, *self._modules})


MODELS = Registry("model")
ADVANTAGES = Registry("advantage estimator")
POLICIES = Registry("policy family")
EXPERTS = Registry("scripted expert")
ENVIRONMENTS = Registry("RL environment")
WORKER_POOLS = Registry("env worker backend")
PLACEMENTS = Registry("rollout placement")
