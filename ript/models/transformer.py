"""A small pre-norm GPT block with an optional key/value cache for incremental decoding."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

KVCache = list  # one (k, v) pair per layer, or None before the first call


class SelfAttention(nn.Module):
    def __init__(self, dim: int, n_head: int, dropout: float):
        super().__init__()
        if dim % n_head:
            raise ValueError(f"dim={dim} is not divisible by n_head={n_head}")
        self.n_head = n_head
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.dropout = dropout

    def forward(
        self, x: torch.Tensor, causal: bool, cache: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_head, c // self.n_head).permute(2, 0, 3, 1, 4)
        past = 0
        if cache is not None:
            past = cache[0].shape[2]
            k = torch.cat([cache[0], k], dim=2)
            v = torch.cat([cache[1], v], dim=2)
        mask = None
        if causal and past > 0 and t > 1:
            # new queries see the whole cache and the new keys up to themselves
            mask = torch.ones(t, past + t, dtype=torch.bool, device=x.device).tril(diagonal=past)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal and past == 0 and t > 1,
            dropout_p=self.dropout if self.training else 0.0,
        )
        y = y.transpose(1, 2).reshape(b, t, c)
        return self.proj(y), (k, v)


class Block(nn.Module):
    def __init__(self, dim: int, n_head: int, dropout: float = 0.0, mlp_ratio: int = 4):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, n_head, dropout)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim), nn.Dropout(dropout)
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, causal: bool = True, cache=None):
        a, new_cache = self.attn(self.ln1(x), causal, cache)
        x = x + self.drop(a)
        x = x + self.mlp(self.ln2(x))
        return x, new_cache


class Transformer(nn.Module):
    """A stack of blocks; ``forward(x, cache)`` returns (hidden, new_cache)."""

    def __init__(self, dim: int, n_layer: int, n_head: int, dropout: float = 0.0, causal: bool = True):
        super().__init__()
        self.causal = causal
        self.blocks = nn.ModuleList(Block(dim, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> tuple[torch.Tensor, KVCache]:
        new_cache = []
        for i, block in enumerate(self.blocks):
            x, layer_cache = block(x, self.causal, None if cache is None else cache[i])
            new_cache.append(layer_cache)
        return self.ln_f(x), new_cache
