"""Advantage estimators, by name: what each recorded decision's PPO step is weighted by.

``rloo`` and ``grpo`` compare the K rollouts of one initial condition (episode returns = success, no critic);
``gae`` uses a learned critic's values over the chunk-level MDP (one decision per executed chunk), so groups
whose rollouts all succeed or all fail still carry signal, and shaped rewards can be used.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from ript.registry import ADVANTAGES
from ript.utils import distributed as ddist


def rloo(rewards: torch.Tensor) -> torch.Tensor:
    """Leave-one-out baseline (RIPT's default): A_i = r_i - mean of the other K-1 rewards. (G, K) -> (G, K)."""
    k = rewards.shape[-1]
    if k < 2:
        raise ValueError("rloo needs at least 2 rollouts per group")
    return rewards - (rewards.sum(-1, keepdim=True) - rewards) / (k - 1)


def grpo(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Group-normalised: (r_i - group mean) / (group std + eps)."""
    mean = rewards.mean(-1, keepdim=True)
    std = rewards.std(-1, keepdim=True, unbiased=False)
    return (rewards - mean) / (std + eps)


def gae(rewards: torch.Tensor, values: torch.Tensor, bootstrap: torch.Tensor, lengths: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over padded episodes: rewards and values (E, T), decisions beyond an
    episode's length ignored; ``bootstrap`` (E,) the value after its last decision (0 where the episode
    terminated, the critic's value of the last observation where the time limit cut it). Returns
    (advantages, returns = advantages + values), zero beyond each length."""
    n_eps, horizon = rewards.shape
    adv = torch.zeros_like(rewards)
    running = torch.zeros(n_eps, dtype=rewards.dtype)
    for t in reversed(range(horizon)):
        inside = t < lengths
        last = t == lengths - 1
        next_value = torch.where(last, bootstrap, values[:, t + 1] if t + 1 < horizon else bootstrap)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = torch.where(last, delta, delta + gamma * lam * running)
        running = torch.where(inside, running, torch.zeros_like(running))
        adv[:, t] = running
    returns = torch.where(torch.arange(horizon) < lengths.unsqueeze(1), adv + values, torch.zeros_like(adv))
    return adv, returns


@dataclass
class Targets:
    """What the update needs of a batch of kept episodes, in decision order."""
    advantages: torch.Tensor            # (N decisions,)
    returns: torch.Tensor | None        # (N,) the critic's regression targets (None without a critic)
    episode_advantages: torch.Tensor    # (E episodes,) an episode's advantage (gae: its first decision's)
    episode_returns: torch.Tensor       # (E,) undiscounted sum of each episode's rewards


class Estimator(ABC):
    """An advantage estimator over the kept groups of an iteration (each a list of K episode dicts)."""
    uses_critic = False
    needs_mixed_groups = True  # dynamic sampling keeps only groups whose rollouts differ in outcome

    def __init__(self, rl_cfg):
        self.rl = rl_cfg

    @abstractmethod
    def targets(self, groups: list[list[dict]], rewards: list[torch.Tensor]) -> Targets:
        """``rewards``: each episode's per-decision rewards, in the groups' episode order."""


class _GroupEstimator(Estimator):
    """Every decision of an episode shares the episode's advantage, computed within its group."""

    @abstractmethod
    def compare(self, returns: torch.Tensor) -> torch.Tensor:
        """(G, K) episode returns -> (G, K) advantages."""

    def targets(self, groups, rewards) -> Targets:
        returns = torch.stack([r.sum() for r in rewards]).view(len(groups), -1)
        adv = self.compare(returns)
        per_decision = [adv.flatten()[e].expand(len(r)) for e, r in enumerate(rewards)]
        return Targets(torch.cat(per_decision).float(), None, adv.flatten().float(), returns.flatten().float())


@ADVANTAGES.register("rloo")
class RLOO(_GroupEstimator):
    def compare(self, returns):
        return rloo(returns)


@ADVANTAGES.register("grpo")
class GRPO(_GroupEstimator):
    def compare(self, returns):
        return grpo(returns)


@ADVANTAGES.register("gae")
class GAE(Estimator):
    uses_critic = True
    needs_mixed_groups = False  # the critic's baseline gives all-success and all-failure groups a signal too

    def targets(self, groups, rewards) -> Targets:
        episodes = [e for g in groups for e in g]
        lengths = torch.tensor([len(r) for r in rewards])
        padded = torch.zeros(len(rewards), int(lengths.max()))
        values = torch.zeros_like(padded)
        bootstrap = torch.zeros(len(rewards))
        for i, (e, r) in enumerate(zip(episodes, rewards)):
            padded[i, : len(r)] = r
            values[i, : len(r)] = torch.stack([d["value"] for d in e["decisions"]]).float().cpu()
            if not e["success"]:  # cut by the time limit: the return goes on past the last observation
                bootstrap[i] = float(e["decisions"][-1]["bootstrap_value"])
        adv, returns = gae(padded, values, bootstrap, lengths, float(self.rl.gamma), float(self.rl.gae_lambda))
        inside = torch.arange(padded.shape[1]) < lengths.unsqueeze(1)
        flat_adv, flat_returns = adv[inside], returns[inside]
        return Targets(flat_adv.float(), flat_returns.float(), adv[:, 0].float(), padded.sum(1).float())


def normalize_over_ranks(x: torch.Tensor | None, info) -> torch.Tensor | None:
    """(x - mean) / std, the moments taken over every rank's decisions (each rank's batch alone would give
    ranks different scales). Every rank calls it, a rank with nothing kept with None."""
    local = [0.0, 0.0, 0.0] if x is None else [float(len(x)), float(x.sum()), float((x.double() ** 2).sum())]
    count, total, squares = ddist.all_sum(local, info)
    if x is None:
        return None
    mean = total / max(count, 1.0)
    std = max(squares / max(count, 1.0) - mean * mean, 0.0) ** 0.5
    return (x - mean) / (std + 1e-8)


def build_estimator(rl_cfg) -> Estimator:
    return ADVANTAGES.get(str(rl_cfg.advantage))(rl_cfg)
