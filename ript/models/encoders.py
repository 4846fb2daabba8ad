"""Observation encoders: a ResNet-18-style image trunk with spatial softmax, and an MLP for low-dim state.

Written here rather than taken from torchvision (whose registry build does not import on CPU torch).
GroupNorm instead of BatchNorm keeps train and eval behaviour identical, which RL fine-tuning needs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ript.errors import RiptError


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(min(32, channels // 4), channels)


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.n1 = _norm(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.n2 = _norm(c_out)
        self.skip = (
            nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), _norm(c_out))
            if stride != 1 or c_in != c_out
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.n1(self.conv1(x)))
        return F.relu(self.n2(self.conv2(y)) + self.skip(x))


class SpatialSoftmax(nn.Module):
    """Expected (x, y) image coordinates of ``num_kp`` learned keypoint maps."""

    def __init__(self, channels: int, num_kp: int):
        super().__init__()
        self.kp = nn.Conv2d(channels, num_kp, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, h, w = x.shape
        heat = self.kp(x).flatten(2).softmax(-1)  # (B, K, H*W)
        ys = torch.linspace(-1, 1, h, device=x.device, dtype=heat.dtype)
        xs = torch.linspace(-1, 1, w, device=x.device, dtype=heat.dtype)
        grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
        ex = heat @ grid_x.reshape(-1, 1)
        ey = heat @ grid_y.reshape(-1, 1)
        return torch.cat([ex, ey], dim=-1).flatten(1)  # (B, 2K)


class ResNetEncoder(nn.Module):
    """uint8 (B, H, W, 3) image -> (B, out_dim). ``width=64`` gives ResNet-18's channel counts; ``stages`` keeps
    its first 1-4 stages: fewer stages leave a finer feature map (128 px: 16x16 after two, 4x4 after four) for the
    keypoints to locate small objects on (QueST keeps two stages and 128 keypoints)."""

    def __init__(self, out_dim: int, width: int = 64, num_kp: int = 32, stages: int = 4):
        super().__init__()
        if not 1 <= stages <= 4:
            raise ValueError(f"encoder stages must be 1-4 (ResNet-18 has four), got {stages}")
        blocks = (2,) * stages
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), _norm(width), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        layers, c = [], width
        for i, n in enumerate(blocks):
            c_out = width * 2**i
            for j in range(n):
                layers.append(BasicBlock(c, c_out, 2 if (j == 0 and i > 0) else 1))
                c = c_out
        self.layers = nn.Sequential(*layers)
        self.stages = stages
        self.pool = SpatialSoftmax(c, num_kp)
        self.proj = nn.Linear(2 * num_kp, out_dim)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = img.permute(0, 3, 1, 2).float() / 127.5 - 1.0
        features = self.layers(self.stem(x))
        if features.shape[-2:] == (1, 1):  # the keypoints of a single cell sit still: the image would not be seen
            raise RiptError(f"image encoder: {img.shape[1]}x{img.shape[2]} images leave a 1x1 feature map after "
                            f"{self.stages} ResNet stages, so the policy would not see them; keep fewer stages "
                            f"(algo.model.encoder_stages / algo.prior.encoder_stages) or render larger images")
        return self.proj(self.pool(features))


class MLPEncoder(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, hidden: int = 128):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.GELU(), nn.Linear(hidden, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


# RGB -> YIQ (luma and two chroma axes); a hue shift is a rotation of the chroma plane
_YIQ = torch.tensor([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
_YIQ_INV = torch.linalg.inv(_YIQ)


def color_jitter(img: torch.Tensor, strength: float, generator: torch.Generator | None, share: slice | None = None,
                 total: int | None = None) -> torch.Tensor:
    """Colour augmentation on uint8 (B, H, W, C) RGB images, as QueST trains with (torchvision's ``ColorJitter``
    at 0.3): each image's brightness, contrast and saturation scaled by factors drawn from [1 - s, 1 + s] and its
    hue turned by up to s of a full turn (a rotation of the YIQ chroma plane), s = ``strength``. Factors are drawn
    for all ``total`` images and the block ``share`` used, as ``random_shift`` draws its offsets."""
    if strength <= 0:
        return img
    b = img.shape[0]
    n, share = (total, share) if share is not None else (b, slice(0, b))
    draw = torch.rand((n, 4), device=img.device, generator=generator)[share]
    scale = 1 + strength * (2 * draw[:, :3] - 1)                       # brightness, contrast, saturation
    turn = 2 * torch.pi * strength * (2 * draw[:, 3] - 1)              # hue, radians
    yiq, yiq_inv = _YIQ.to(img.device), _YIQ_INV.to(img.device)
    factor = scale[:, :, None, None, None]                             # (B, 3, 1, 1, 1)
    x = img.float() * factor[:, 0]
    mean = (x @ yiq[0]).mean((1, 2))[:, None, None, None]             # each image's mean luma
    x = (x - mean) * factor[:, 1] + mean
    gray = (x @ yiq[0])[..., None]                                     # (B, H, W, 1) luma
    x = gray + (x - gray) * factor[:, 2]
    cos, sin = torch.cos(turn), torch.sin(turn)
    rotate = torch.zeros(b, 3, 3, device=x.device)
    rotate[:, 0, 0] = 1
    rotate[:, 1, 1], rotate[:, 1, 2], rotate[:, 2, 1], rotate[:, 2, 2] = cos, -sin, sin, cos
    matrix = yiq_inv @ rotate @ yiq                                    # (B, 3, 3), RGB -> RGB
    x = torch.einsum("bij,bhwj->bhwi", matrix, x)
    return x.round().clamp(0, 255).to(img.dtype)


def random_shift(img: torch.Tensor, pad: int, generator: torch.Generator | None, share: slice | None = None,
                 total: int | None = None) -> torch.Tensor:
    """DrQ-style augmentation on uint8 (B, H, W, C) images: pad by replication and crop at a random offset.
    ``img`` may be one rank's block ``share`` of ``total`` images: the offsets are drawn for all of them and the
    block's are used, so each sample is shifted alike whatever the number of processes."""
    if pad <= 0:
        return img
    b, h, w, _ = img.shape
    n, share = (total, share) if share is not None else (b, slice(0, b))
    padded = F.pad(img.permute(0, 3, 1, 2).float(), (pad, pad, pad, pad), mode="replicate")
    dx = torch.randint(0, 2 * pad + 1, (n,), device=img.device, generator=generator)[share]
    dy = torch.randint(0, 2 * pad + 1, (n,), device=img.device, generator=generator)[share]
    rows = (dy[:, None] + torch.arange(h, device=img.device)[None])  # (B, H)
    cols = (dx[:, None] + torch.arange(w, device=img.device)[None])  # (B, W)
    batch = torch.arange(b, device=img.device)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]]
    return out.to(img.dtype)
