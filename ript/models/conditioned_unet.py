"""The U-Net the world model's predictions come from: residual conv blocks FiLM-conditioned on one vector (the
actions, the robot state and the task; a denoiser adds its noise levels to it), skip connections at every
resolution, and the pooled bottleneck that the state and success heads read."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(min(8, channels // 4) or 1, channels)


class FiLMBlock(nn.Module):
    """A residual conv block whose normalised features are scaled and shifted by the conditioning vector."""

    def __init__(self, c_in: int, c_out: int, cond_dim: int):
        super().__init__()
        self.n1, self.conv1 = _norm(c_in), nn.Conv2d(c_in, c_out, 3, 1, 1)
        self.n2, self.conv2 = _norm(c_out), nn.Conv2d(c_out, c_out, 3, 1, 1)
        self.film = nn.Linear(cond_dim, 2 * c_out)
        nn.init.zeros_(self.film.weight)
        nn.init.zeros_(self.film.bias)
        self.skip = nn.Conv2d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.n1(x)))
        scale, shift = self.film(cond)[:, :, None, None].chunk(2, dim=1)
        h = self.conv2(F.silu(self.n2(h) * (1 + scale) + shift))
        return self.skip(x) + h


class ConditionedUNet(nn.Module):
    """(B, C, H, W) images and a (B, cond_dim) vector -> (``out_channels`` maps at full resolution, C by default:
    the images' change; the pooled bottleneck (B, width*m))."""

    def __init__(self, channels: int, width: int, stages: int, cond_dim: int, out_channels: int | None = None):
        super().__init__()
        out_channels = out_channels or channels
        widths = [width * min(2**i, 4) for i in range(stages + 1)]
        self.stem = nn.Conv2d(channels, widths[0], 3, 1, 1)
        # each level keeps its width; the strided conv below it widens (the full-resolution convs stay narrow)
        self.down = nn.ModuleList(FiLMBlock(widths[i], widths[i], cond_dim) for i in range(stages))
        self.pool = nn.ModuleList(nn.Conv2d(widths[i], widths[i + 1], 3, 2, 1) for i in range(stages))
        self.middle = nn.ModuleList([FiLMBlock(widths[-1], widths[-1], cond_dim) for _ in range(2)])
        self.up = nn.ModuleList(FiLMBlock(widths[i + 1] + widths[i], widths[i], cond_dim)
                                for i in reversed(range(stages)))
        self.out_norm, self.out = _norm(widths[0]), nn.Conv2d(widths[0], out_channels, 3, 1, 1)
        nn.init.zeros_(self.out.weight)  # starts as "nothing changes", the best guess before training
        nn.init.zeros_(self.out.bias)
        self.bottleneck_width = widths[-1]

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h, skips = self.stem(x), []
        for block, pool in zip(self.down, self.pool):
            h = block(h, cond)
            skips.append(h)
            h = pool(h)
        for block in self.middle:
            h = block(h, cond)
        pooled = h.mean(dim=(2, 3))
        for block in self.up:
            skip = skips.pop()
            h = block(torch.cat([F.interpolate(h, size=skip.shape[-2:], mode="nearest"), skip], dim=1), cond)
        return self.out(F.silu(self.out_norm(h))), pooled
