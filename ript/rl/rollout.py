"""Rollouts for RL: dynamic sampling of groups of K rollouts per initial condition until B informative groups
(over all ranks) are kept, and the kept groups' decisions with their advantages. A round draws more groups
than it needs when many will come out all-success or all-failure, and ends as soon as its first groups in draw
order settle the need."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ript.envs.episodes import Runner, StopRule, decision_counts
from ript.envs.worker_env import EpisodeSpec
from ript.errors import RiptError
from ript.evaluation.environments import EnvironmentSetting, build_environment
from ript.policies.base import ChunkingPolicy
from ript.registry import ADVANTAGES
from ript.rl.advantages import Estimator, Targets
from ript.rl.sampler import InitialConditionSampler
from ript.utils import distributed as ddist

# auto oversampling draws at most this many times the groups still needed in a round
MAX_AUTO_OVERSAMPLE = 4.0


@dataclass(frozen=True)
class GroupSampling:
    """Dynamic sampling's settings, read from the config once: K rollouts per initial condition, B informative
    groups per iteration over all ranks, at most ``max_rounds`` rounds of fresh initial conditions, and how many
    groups a round draws for those it needs (``oversample``; None: auto)."""
    k: int
    groups: int
    max_rounds: int
    oversample: float | None
    mixed_only: bool = True  # keep only groups whose rollouts differ in outcome (critic-free estimators)

    @classmethod
    def from_config(cls, rl_cfg) -> GroupSampling:
        over = None if rl_cfg.oversample == "auto" else float(rl_cfg.oversample)
        return cls(int(rl_cfg.rollouts_per_group), int(rl_cfg.groups_per_iteration), int(rl_cfg.max_sampling_rounds),
                   over, ADVANTAGES.get(str(rl_cfg.advantage)).needs_mixed_groups)

    def keeps(self, outcomes: list[bool]) -> bool:
        """Whether a complete group with these outcomes is kept for the update."""
        return not self.mixed_only or len(set(outcomes)) > 1

    def local_groups(self, world_size: int) -> int:
        """Informative groups each rank keeps (B over all ranks)."""
        return math.ceil(self.groups / world_size)

    def most_episodes_per_round(self, world_size: int) -> int:
        """The most episodes a rank's round draws (its first, needing every group), which sizes its workers."""
        factor = MAX_AUTO_OVERSAMPLE if self.oversample is None else self.oversample
        return math.ceil(self.local_groups(world_size) * factor) * self.k

    def groups_to_draw(self, need: int, sampler: InitialConditionSampler, env_slots: int) -> int:
        """Groups to draw for ``need`` informative ones. Auto: as many as the sampler expects to hold ``need``
        mixed groups (at most 4x), and at least enough to give every env slot an episode. A round waits for its
        longest episode, so a round that is sure to fall short costs another round's wait; the extra groups
        run on slots that would idle, and those not needed are cancelled (``InformativePrefix``)."""
        if need == 0:
            return 0
        if not self.mixed_only:
            return need  # every complete group is kept
        if self.oversample is not None:
            return math.ceil(need * self.oversample)
        factor = min(MAX_AUTO_OVERSAMPLE, 1.0 / max(sampler.informative_share(), 1e-9))
        return max(math.ceil(need * factor), math.ceil(env_slots / self.k))


class InformativePrefix(StopRule):
    """Satisfied once the first groups in draw order have all ended and hold ``need`` informative (mixed) ones;
    only those groups count, so which groups are kept depends on the draw and the outcomes, not on timing."""

    def __init__(self, n_groups: int, k: int, need: int, mixed_only: bool = True):
        self.k, self.need, self.mixed_only = k, need, mixed_only
        self.ended = [0] * n_groups        # episodes ended per group (finished or lost)
        self.outcomes: list[set[bool]] = [set() for _ in range(n_groups)]
        self.lost = [False] * n_groups     # a group that lost a rollout is left out whole
        self.settled = 0                   # groups [0, settled) have ended and are counted
        self.informative = 0

    def finished(self, episode: dict) -> None:
        g = episode["episode"] // self.k
        self.ended[g] += 1
        self.outcomes[g].add(bool(episode["success"]))

    def dropped(self, spec: EpisodeSpec) -> None:
        g = spec.index // self.k
        self.ended[g] += 1
        self.lost[g] = True

    def satisfied(self) -> bool:
        while self.settled < len(self.ended) and self.informative < self.need and self.ended[self.settled] == self.k:
            g = self.settled
            self.informative += int(not self.lost[g] and (len(self.outcomes[g]) > 1 or not self.mixed_only))
            self.settled += 1
        return self.informative >= self.need


def collect_groups(runner: Runner, policy: ChunkingPolicy, sampler: InitialConditionSampler,
                   sampling: GroupSampling, info, video_dir: Path | None = None, process_group=None) -> dict:
    """Dynamic sampling: rounds of K rollouts per initial condition until B informative groups (over all ranks,
    counted over ``process_group``: the default one unless given). Each round keeps its groups up to the one
    that completes the need, in draw order (the sampler learns from exactly those); later groups are cancelled
    or ignored. With ``video_dir``, the first rollout of the first round is recorded there as an mp4."""
    k = sampling.k
    t0 = time.perf_counter()
    local_target = sampling.local_groups(info.world_size)
    kept, episodes, rounds, sync = [], [], 0, 0.0
    dropped = cancelled = env_steps = 0
    busy = idle = 0.0  # env workers' busy and the driver's idle shares of the rounds, weighted by their seconds
    build = 0.0  # the env workers' share spent building simulator tasks, likewise
    decisions = dict.fromkeys(("decisions", "decision_rounds", "decision_rows"), 0)  # the policy's batched calls
    while True:
        need = max(0, local_target - len(kept))
        ics = sampler.draw(sampling.groups_to_draw(need, sampler, runner.env_slots))
        # episode index g*K + j: group g of this round, even when two draws share an initial condition
        specs = [EpisodeSpec(task, seed, g * k + j) for g, (task, seed) in enumerate(ics) for j in range(k)]
        if specs and video_dir is not None and rounds == 0:
            specs[0] = dataclasses.replace(specs[0], record=True)  # recording changes what is saved, not the episode
        prefix = InformativePrefix(len(ics), k, need, sampling.mixed_only)
        results = runner.run(policy, video_dir=video_dir, specs=specs, stop=prefix) if specs else \
            {"episodes": [], "dropped": 0, "cancelled": 0, "env_steps": 0, "worker_busy_share": 0.0,
             "driver_idle_share": 0.0, "task_build_share": 0.0, "seconds": 0.0, **decision_counts(0, 0, 0)}
        prefix.satisfied()  # a round that ran to the end: every group counts
        dropped += results["dropped"]
        cancelled += results["cancelled"]
        env_steps += results["env_steps"]
        busy += results["worker_busy_share"] * results["seconds"]
        idle += results["driver_idle_share"] * results["seconds"]
        build += results["task_build_share"] * results["seconds"]
        for key in decisions:
            decisions[key] += results[key]
        counted = [e for e in results["episodes"] if e["episode"] // k < prefix.settled]
        for group in group_episodes(counted, k):
            rewards = [float(e["success"]) for e in group]
            sampler.record((group[0]["task"], group[0]["seed"]), rewards)
            episodes.extend(group)
            if sampling.keeps([e["success"] for e in group]):
                kept.append(group)
        rounds += 1
        t = time.perf_counter()
        total_kept = ddist.all_sum([len(kept)], info, process_group)[0]
        sync += time.perf_counter() - t
        if total_kept >= sampling.groups or rounds >= sampling.max_rounds:
            break
    capped = total_kept < sampling.groups
    seconds = time.perf_counter() - t0
    return {"kept": kept, "episodes": episodes, "rounds": rounds, "capped": capped, "total_kept": total_kept,
            "sync": sync, "dropped": dropped, "cancelled": cancelled, "env_steps": env_steps,
            "worker_busy_share": busy / max(1e-9, seconds), "driver_idle_share": idle / max(1e-9, seconds),
            "task_build_share": build / max(1e-9, seconds), "seconds": seconds, **decisions}


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


def decision_rewards(episode: dict, kind: str, scale: float) -> torch.Tensor:
    """One reward per decision of a recorded episode: sparse, 1 on the decision whose chunk succeeded; dense,
    the suite's reward summed over each executed chunk. Times ``scale``."""
    n = len(episode["decisions"])
    if kind == "dense":
        rewards = torch.tensor(episode["chunk_rewards"], dtype=torch.float32)
        if len(rewards) != n:
            raise RuntimeError(f"episode {episode['episode']} of {episode['task']}: {len(rewards)} chunk rewards "
                               f"for {n} decisions")
    else:
        rewards = torch.zeros(n)
        rewards[-1] = float(episode["success"])
    return rewards * scale


def flatten_groups(kept: list[list[dict]], estimator: Estimator, reward: str = "sparse", reward_scale: float = 1.0
                   ) -> tuple[list[dict], Targets] | None:
    """The kept groups' decisions in order, with the estimator's advantages (and critic targets)."""
    if not kept:
        return None
    rewards = [decision_rewards(e, reward, reward_scale) for g in kept for e in g]
    decisions = [d for g in kept for e in g for d in e["decisions"]]
    return decisions, estimator.targets(kept, rewards)


def rollout_environment(cfg, info, metadata: dict, task_names: list[str], policy: ChunkingPolicy, device: str):
    """This rank's rollout runner (``environment=``), built and checked before the run folder is created. Its
    share of the host: its env workers, and the cores they leave to the policy's host-side ops."""
    share = info.cores_per_rank()
    workers = share if cfg.rl.num_workers == "auto" else int(cfg.rl.num_workers)
    runner = build_environment(EnvironmentSetting(
        cfg.environment, cfg.workers, metadata, task_names, policy, device, workers, cfg.rl.max_episode_steps,
        episodes_per_task=1, on_worker_failure="drop", driver_threads=max(1, share - workers),
        episodes_at_once=GroupSampling.from_config(cfg.rl).most_episodes_per_round(info.world_size)))
    if cfg.rl.reward == "dense" and runner.shaped_reward is not None:
        runner.close()
        raise RiptError(f"rl.reward=dense: {runner.shaped_reward} has no shaped reward; use rl.reward=sparse")
    return runner
