"""Each env's last ``depth`` observations, one array per observation key with a row per env.

A decision reads the frame stacks of the envs it plans; kept as rows of one array per key, a batch is one gather
(consecutive rows: a slice, no copy) instead of stacking every env's frames anew, which at 64 envs of two 128 px
cameras cost ~12 ms of the driving process per decision. On a GPU the arrays live in pinned host memory, so a
batch goes to the device in one asynchronous copy per key.
"""

from __future__ import annotations

import numpy as np
import torch

from ript.errors import RiptError


class FrameStacks:
    def __init__(self, n_envs: int, depth: int, pin: bool):
        self.n_envs, self.depth, self.pin = n_envs, depth, pin
        self.arrays: dict[str, torch.Tensor] = {}   # key -> (n_envs, depth, *frame shape), allocated on first use
        self.fresh = [True] * n_envs                 # the env's episode has had no observation yet

    def begin(self, i: int) -> None:
        """Env i starts an episode: its first observation fills the whole stack (the start is padded with it)."""
        self.fresh[i] = True

    def put(self, i: int, frame: dict[str, np.ndarray]) -> None:
        for key, value in frame.items():
            rows = self._array(key, value).numpy()
            if self.fresh[i]:
                rows[i] = value  # broadcast over the stack's depth
            else:
                rows[i, :-1] = rows[i, 1:]  # numpy copies overlapping slices correctly
                rows[i, -1] = value
        self.fresh[i] = False

    def batch(self, rows: list[int]) -> dict[str, torch.Tensor]:
        """(len(rows), depth, ...) per key; a slice of the arrays when ``rows`` are consecutive envs (valid until
        the next ``put``: the caller copies it to the device, or clones it, before observing again)."""
        if rows == list(range(rows[0], rows[0] + len(rows))):
            return {k: v[rows[0]: rows[0] + len(rows)] for k, v in self.arrays.items()}
        index = torch.tensor(rows)
        return {k: v.index_select(0, index) for k, v in self.arrays.items()}

    def _array(self, key: str, value: np.ndarray) -> torch.Tensor:
        value = np.asarray(value)
        array = self.arrays.get(key)
        if array is None:
            array = torch.zeros((self.n_envs, self.depth, *value.shape), dtype=torch.from_numpy(value[None]).dtype,
                                pin_memory=self.pin)
            self.arrays[key] = array
        elif tuple(array.shape[2:]) != value.shape:
            raise RiptError(f"observation {key!r} has shape {value.shape}; earlier ones had {tuple(array.shape[2:])}")
        return array
