"""Advantage estimators over groups of K rollouts from one initial condition, by name."""

from __future__ import annotations

import torch

from ript.registry import ADVANTAGES


@ADVANTAGES.register("rloo")
def rloo(rewards: torch.Tensor) -> torch.Tensor:
    """Leave-one-out baseline (RIPT's default): A_i = r_i - mean of the other K-1 rewards. (G, K) -> (G, K)."""
    k = rewards.shape[-1]
    if k < 2:
        raise ValueError("rloo needs at least 2 rollouts per group")
    return rewards - (rewards.sum(-1, keepdim=True) - rewards) / (k - 1)


@ADVANTAGES.register("grpo")
def grpo(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Group-normalised: (r_i - group mean) / (group std + eps)."""
    mean = rewards.mean(-1, keepdim=True)
    std = rewards.std(-1, keepdim=True, unbiased=False)
    return (rewards - mean) / (std + eps)
