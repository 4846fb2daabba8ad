"""Rollouts for RL: dynamic sampling of groups of K rollouts per initial condition until B informative groups
(over all ranks) are kept, and the kept groups' decisions with their advantages."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ript.envs.runner import EnvRunner
from ript.envs.worker_env import EpisodeSpec
from ript.policies.base import ChunkingPolicy
from ript.registry import ADVANTAGES
from ript.rl import advantages as _advantages  # noqa: F401  (registers the estimators)
from ript.rl.sampler import InitialConditionSampler
from ript.utils import distributed as ddist


@dataclass(frozen=True)
class GroupSampling:
    """Dynamic sampling's settings, read from the config once: K rollouts per initial condition, B informative
    groups per iteration over all ranks, at most ``max_rounds`` rounds of fresh initial conditions."""
    k: int
    groups: int
    max_rounds: int

    @classmethod
    def from_config(cls, rl_cfg) -> GroupSampling:
        return cls(int(rl_cfg.rollouts_per_group), int(rl_cfg.groups_per_iteration), int(rl_cfg.max_sampling_rounds))


def collect_groups(runner: EnvRunner, policy: ChunkingPolicy, sampler: InitialConditionSampler,
                   sampling: GroupSampling, info, video_dir: Path | None = None) -> dict:
    """Dynamic sampling: rounds of K rollouts per initial condition until B informative groups (over all ranks).
    With ``video_dir``, the first rollout of the first round is recorded there as an mp4."""
    k = sampling.k
    local_target = math.ceil(sampling.groups / info.world_size)
    kept, episodes, rounds, sync, dropped = [], [], 0, 0.0, 0
    while True:
        need = max(0, local_target - len(kept))
        ics = sampler.draw(need)
        # episode index g*K + j: group g of this round, even when two draws share an initial condition
        specs = [EpisodeSpec(task, seed, g * k + j) for g, (task, seed) in enumerate(ics) for j in range(k)]
        if specs and video_dir is not None and rounds == 0:
            specs[0] = dataclasses.replace(specs[0], record=True)  # recording changes what is saved, not the episode
        results = runner.run(policy, video_dir=video_dir, specs=specs) if specs else {"episodes": [], "dropped": 0}
        dropped += results["dropped"]
        for group in group_episodes(results["episodes"], k):
            rewards = [float(e["success"]) for e in group]
            sampler.record((group[0]["task"], group[0]["seed"]), rewards)
            episodes.extend(group)
            if len(set(rewards)) > 1:
                kept.append(group)
        rounds += 1
        t = time.perf_counter()
        total_kept = ddist.all_sum([len(kept)], info)[0]
        sync += time.perf_counter() - t
        if total_kept >= sampling.groups or rounds >= sampling.max_rounds:
            break
    capped = total_kept < sampling.groups
    return {"kept": kept, "episodes": episodes, "rounds": rounds, "capped": capped, "total_kept": total_kept,
            "sync": sync, "dropped": dropped}


def group_episodes(episodes: list[dict], k: int) -> list[list[dict]]:
    """Split one round's episodes into its groups of K rollouts (episode index g*K + j), in draw order. A
    group that lost a rollout to a failed env worker is left out whole (its leave-one-out baseline needs K)."""
    groups: dict[int, list[dict]] = {}
    for e in episodes:
        groups.setdefault(e["episode"] // k, []).append(e)
    out = []
    for g in sorted(groups):
        group = sorted(groups[g], key=lambda e: e["episode"])
        if len({(e["task"], e["seed"]) for e in group}) != 1 or len({e["episode"] for e in group}) != len(group):
            raise RuntimeError(f"rollout group {g} is malformed: {len(group)} episodes for K={k}")
        if len(group) == k:
            out.append(group)
    return out


def flatten_groups(kept: list[list[dict]], estimator: str) -> tuple[list[dict], torch.Tensor, torch.Tensor] | None:
    """The kept groups' decisions in order, each decision's advantage, and the (groups, K) advantages."""
    if not kept:
        return None
    rewards = torch.tensor([[float(e["success"]) for e in g] for g in kept])
    adv = ADVANTAGES.get(estimator)(rewards)
    decisions, per_decision = [], []
    for g, group in enumerate(kept):
        for j, e in enumerate(group):
            decisions.extend(e["decisions"])
            per_decision.extend([adv[g, j]] * len(e["decisions"]))
    return decisions, torch.stack(per_decision).float(), adv
