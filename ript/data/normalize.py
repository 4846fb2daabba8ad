"""Normalisation statistics that live inside the model (as buffers), so they are saved with its weights."""

from __future__ import annotations

import torch
from torch import nn

from ript.errors import RiptError


class Normalizer(nn.Module):
    """Maps a vector to roughly [-1, 1]: ``minmax`` for actions, ``meanstd`` for states."""

    def __init__(self, dim: int, mode: str = "minmax"):
        super().__init__()
        if mode not in ("minmax", "meanstd"):
            raise RiptError(f"normalizer mode {mode!r}: expected 'minmax' or 'meanstd'")
        self.mode = mode
        self.register_buffer("offset", torch.zeros(dim))
        self.register_buffer("scale", torch.ones(dim))

    @torch.no_grad()
    def fit(self, data: torch.Tensor) -> Normalizer:
        data = data.reshape(-1, data.shape[-1]).float()
        if self.mode == "minmax":
            lo, hi = data.min(0).values, data.max(0).values
            self.offset.copy_((hi + lo) / 2)
            self.scale.copy_(((hi - lo) / 2).clamp(min=1e-4))
        else:
            self.offset.copy_(data.mean(0))
            self.scale.copy_(data.std(0).clamp(min=1e-4))
        return self

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.offset) / self.scale

    def unnormalize(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.offset
