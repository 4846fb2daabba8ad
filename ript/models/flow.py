"""A flow-matching chunk policy (π0's recipe at a size trained here): a prefix of the task and observation tokens,
encoded once per decision, and an action expert, a transformer over the noisy action chunk whose every layer
also attends to the prefix (its keys and values computed once per decision and reused by every denoise step),
conditioned on the flow time by adaptive layer norm.

Convention (π0's): ``x_τ = τ·ε + (1 − τ)·a`` with ε ~ N(0, I) and a the normalised action chunk, so τ = 1 is
noise and τ = 0 data; the expert predicts the velocity ``u = ε − a``; sampling integrates from τ = 1 to 0.
The expert also carries a noise head (Flow-Noise RL's learned standard deviation per action element) that
imitation leaves untrained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ript.data.normalize import Normalizer
from ript.errors import RiptError
from ript.models.conditioning import ObservationConditioned
from ript.models.transformer import Transformer
from ript.registry import MODELS

TIME_SAMPLINGS = ("beta", "uniform")


@dataclass
class Prefix:
    """What a flow model reads of a decision's inputs: the prefix's features (B, P, width), which a value head
    after the prefix reads, and ``cache``, what the action expert attends to at every denoise step."""
    features: torch.Tensor
    cache: Any


def time_embedding(tau: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal features (B, dim) of flow times τ (B,) in [0, 1]."""
    half = dim // 2
    freqs = torch.exp(-math.log(10_000.0) * torch.arange(half, device=tau.device, dtype=torch.float32) / half)
    angles = (tau.float() * 1000.0)[:, None] * freqs[None]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class ExpertBlock(nn.Module):
    """Pre-norm attention over [prefix; action tokens] for the action tokens' queries, then an MLP; both modulated
    by the flow time (adaLN-Zero: each block starts as the identity)."""

    def __init__(self, dim: int, n_head: int, dropout: float):
        super().__init__()
        if dim % n_head:
            raise RiptError(f"flow policy: dim={dim} is not divisible by n_head={n_head}")
        self.n_head, self.dropout = n_head, dropout
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False)
        self.prefix_norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.prefix_kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim))
        self.modulation = nn.Linear(dim, 6 * dim)
        nn.init.zeros_(self.modulation.weight)
        nn.init.zeros_(self.modulation.bias)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        return x.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)

    def prefix_keys_values(self, prefix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.prefix_kv(self.prefix_norm(prefix)).chunk(2, dim=-1)
        return self._heads(k), self._heads(v)

    def forward(self, x: torch.Tensor, cond: torch.Tensor, prefix_kv: tuple[torch.Tensor, torch.Tensor]):
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(F.silu(cond)).unsqueeze(1).chunk(6, dim=-1)
        h = self.norm1(x) * (1 + scale1) + shift1
        q, k, v = (self._heads(t) for t in self.qkv(h).chunk(3, dim=-1))
        k, v = torch.cat([prefix_kv[0], k], dim=2), torch.cat([prefix_kv[1], v], dim=2)
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        x = x + gate1 * self.proj(a.transpose(1, 2).flatten(2))
        return x + gate2 * self.mlp(self.norm2(x) * (1 + scale2) + shift2)


@MODELS.register("flow")
class FlowPolicyModel(ObservationConditioned):
    stage = "flow"

    def __init__(
        self,
        task_names: list[str],
        image_keys: list[str],
        lowdim_dims: dict[str, int],
        action_dim: int,
        chunk_size: int = 8,
        lang_dim: int | None = 384,
        frame_stack: int = 1,
        dim: int = 256,
        prefix_layers: int = 2,
        expert_layers: int = 4,
        n_head: int = 8,
        dropout: float = 0.1,
        encoder_width: int = 64,
        num_kp: int = 32,
        encoder_stages: int = 4,
        time_sampling: str = "beta",
    ):
        super().__init__()
        if time_sampling not in TIME_SAMPLINGS:
            raise RiptError(f"flow policy: time_sampling={time_sampling!r}; choose one of {', '.join(TIME_SAMPLINGS)}")
        self.init_conditioning(task_names, image_keys, lowdim_dims, lang_dim, frame_stack, dim, encoder_width, num_kp,
                               encoder_stages)
        self.action_dim, self.chunk_size, self.dim, self.time_sampling = action_dim, chunk_size, dim, time_sampling
        self.action_normalizer = Normalizer(action_dim, "minmax")
        self.prefix_pos = nn.Parameter(torch.randn(1, self.observation_tokens, dim) * 0.02)
        self.prefix_encoder = Transformer(dim, prefix_layers, n_head, dropout, causal=False)
        self.action_in = nn.Linear(action_dim, dim)
        self.action_pos = nn.Parameter(torch.randn(1, chunk_size, dim) * 0.02)
        self.time_mlp = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.blocks = nn.ModuleList(ExpertBlock(dim, n_head, dropout) for _ in range(expert_layers))
        self.out_norm = nn.LayerNorm(dim, elementwise_affine=False)
        self.out_modulation = nn.Linear(dim, 2 * dim)
        nn.init.zeros_(self.out_modulation.weight)
        nn.init.zeros_(self.out_modulation.bias)
        self.velocity_out = nn.Linear(dim, action_dim)
        self.noise_head = nn.Linear(dim, action_dim)  # Flow-Noise's std per element (RL trains it)
        nn.init.zeros_(self.noise_head.weight)
        nn.init.zeros_(self.noise_head.bias)

    def expert_parameters(self) -> list[nn.Parameter]:
        """The action expert: what πRL trains (the prefix and observation encoders stay as imitation left them)."""
        parts = [self.action_in, self.time_mlp, self.blocks, self.out_modulation, self.velocity_out, self.noise_head]
        return [self.action_pos, *(p for part in parts for p in part.parameters())]

    # ----------------------------------------------------------------- the prefix
    # RL's update rebuilds the expert's cache from recorded prefix features (a few tokens per decision) instead
    # of re-encoding the observations, when the prefix does not train
    rescores_from_features = True
    layer_methods = ("prefix_keys_values",)  # a layer's method run besides its forward (rl.fsdp gathers around it)

    @property
    def prefix_width(self) -> int:
        return self.dim

    @property
    def expert_width(self) -> int:
        return self.dim

    def encode(self, obs: dict[str, torch.Tensor], task_ids: torch.Tensor) -> Prefix:
        """Task and observation tokens encoded together (B, observation_tokens, dim), and the expert's cache."""
        h, _ = self.prefix_encoder(self.observation_context(obs, task_ids) + self.prefix_pos)
        return Prefix(h, self.cache_from(h))

    def cache_from(self, features: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every expert layer's keys and values of the prefix, computed once per decision."""
        return [block.prefix_keys_values(features) for block in self.blocks]

    # ----------------------------------------------------------------- the action expert
    def expert(self, x: torch.Tensor, tau: torch.Tensor, cache: list) -> tuple[torch.Tensor, torch.Tensor]:
        """Noisy normalised chunks x (B, chunk, A) at flow times τ (B,) -> (velocity (B, chunk, A), the expert's
        last hidden states (B, chunk, dim), which the noise head and a value head read)."""
        cond = self.time_mlp(time_embedding(tau, self.dim).to(x.dtype))
        h = self.action_in(x) + self.action_pos
        for block, kv in zip(self.blocks, cache, strict=True):
            h = block(h, cond, kv)
        shift, scale = self.out_modulation(F.silu(cond)).unsqueeze(1).chunk(2, dim=-1)
        h = self.out_norm(h) * (1 + scale) + shift
        return self.velocity_out(h), h

    def noise_std(self, hidden: torch.Tensor, low: float, high: float) -> torch.Tensor:
        """Flow-Noise's standard deviation per element, bounded to [low, high] (mid-range before RL)."""
        return low + (high - low) * torch.sigmoid(self.noise_head(hidden).float())

    # ----------------------------------------------------------------- training
    def draw_times(self, batch: int, device, generator: torch.Generator | None) -> torch.Tensor:
        """Flow times for the loss: ``beta`` as π0 (0.001 + 0.999·Beta(1.5, 1): more weight on the noisier times,
        where the chunk's coarse shape is decided) or ``uniform``."""
        u = torch.rand(batch, device=device, generator=generator)
        if self.time_sampling == "uniform":
            return u
        return 0.001 + 0.999 * u.pow(1.0 / 1.5)  # Beta(1.5, 1) by inverting its CDF t^1.5

    def loss(self, obs: dict[str, torch.Tensor], task_ids: torch.Tensor, actions: torch.Tensor, noise: torch.Tensor,
             tau: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The flow-matching loss of raw action chunks (B, chunk, A) with their noise (B, chunk, A) and times (B,):
        the expert's velocity against ε − a, over the chunk's steps inside the episode (``mask`` (B, chunk))."""
        a = self.action_normalizer.normalize(actions)
        t = tau.to(a.dtype)[:, None, None]
        velocity, _ = self.expert(t * noise + (1 - t) * a, tau, self.encode(obs, task_ids).cache)
        err = (velocity.float() - (noise - a).float()).pow(2).mean(-1)
        if mask is None:
            mse = err.mean()
        else:
            m = mask.to(err.dtype)
            mse = (err * m).sum() / m.sum().clamp(min=1)
        return {"loss": mse, "mse": mse}
