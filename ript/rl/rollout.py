"""Rollouts for RL: dynamic sampling of groups of K rollouts per initial condition until B informative groups
(over all ranks) are kept, and the kept groups' decisions with their advantages. Groups stream onto the env
slots as they free up, in draw order, and the run ends as soon as its first groups in draw order settle the need:
no slot waits for a round's longest episode."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ript.envs.episodes import Runner, StopRule
from ript.envs.worker_env import EpisodeSpec
from ript.errors import RiptError
from ript.evaluation.environments import EnvironmentSetting, build_environment
from ript.policies.base import ChunkingPolicy
from ript.registry import ADVANTAGES
from ript.rl.advantages import Estimator, Targets
from ript.rl.sampler import GroupDraws, InitialConditionSampler
from ript.utils import distributed as ddist

# auto oversampling draws at most this many times the groups still needed
MAX_AUTO_OVERSAMPLE = 4.0


@dataclass(frozen=True)
class GroupSampling:
    """Dynamic sampling's settings, read from the config once: K rollouts per initial condition, B informative
    groups per iteration over all ranks, and the most groups an iteration draws: ``max_rounds`` times a round's
    worth (the groups needed times ``oversample``, None: auto, and at least enough to fill the env slots once)."""
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
        """The most episodes a round's worth of groups holds (needing every group), which sizes the workers."""
        factor = MAX_AUTO_OVERSAMPLE if self.oversample is None else self.oversample
        return math.ceil(self.local_groups(world_size) * factor) * self.k

    def round_groups(self, need: int, sampler: InitialConditionSampler, env_slots: int) -> int:
        """A round's worth of groups for ``need`` informative ones. Auto: as many as the sampler expects to hold
        ``need`` mixed groups (at most 4x), and at least enough to give every env slot an episode."""
        if need == 0:
            return 0
        if not self.mixed_only:
            return need  # every complete group is kept
        if self.oversample is not None:
            return math.ceil(need * self.oversample)
        factor = min(MAX_AUTO_OVERSAMPLE, 1.0 / max(sampler.informative_share(), 1e-9))
        return max(math.ceil(need * factor), math.ceil(env_slots / self.k))

    def most_groups(self, need: int, sampler: InitialConditionSampler, env_slots: int) -> int:
        """The most groups an iteration draws for ``need`` informative ones; all of them when every complete
        group is kept (the first ``need`` settle it, so more could only be cancelled)."""
        if not self.mixed_only:
            return need
        return self.max_rounds * self.round_groups(need, sampler, env_slots)


class InformativePrefix(StopRule):
    """Satisfied once the first groups in draw order have all ended and hold ``need`` informative (mixed) ones;
    only those groups count, so which groups are kept depends on the draw and the outcomes, not on timing."""

    def __init__(self, k: int, need: int, mixed_only: bool = True):
        self.k, self.need, self.mixed_only = k, need, mixed_only
        self.ended: list[int] = []         # episodes ended per group (finished or lost), in draw order
        self.outcomes: list[set[bool]] = []
        self.lost: list[bool] = []         # a group that lost a rollout is left out whole
        self.settled = 0                   # groups [0, settled) have ended and are counted
        self.informative = 0

    def add_group(self) -> int:
        """One more group, last in draw order: its number."""
        self.ended.append(0)
        self.outcomes.append(set())
        self.lost.append(False)
        return len(self.ended) - 1

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


class GroupStream(InformativePrefix):
    """The informative prefix over groups drawn one at a time as env slots free up (``StopRule.more``), up to
    ``most`` groups: group g's K rollouts are episodes g*K .. g*K+K-1 of ``draws.draw(g)``. With ``record_first``
    the first rollout of the first group is recorded as a video."""

    def __init__(self, draws: GroupDraws, k: int, need: int, most: int, mixed_only: bool = True,
                 record_first: bool = False):
        super().__init__(k, need, mixed_only)
        self.draws, self.most, self.record_first = draws, most, record_first

    def more(self) -> list[EpisodeSpec]:
        if len(self.ended) >= self.most or self.satisfied():
            return []
        g = self.add_group()
        task, seed = self.draws.draw(g)
        specs = [EpisodeSpec(task, seed, g * self.k + j) for j in range(self.k)]
        if g == 0 and self.record_first:
            specs[0] = dataclasses.replace(specs[0], record=True)  # recording changes what is saved, not the episode
        return specs


def collect_groups(runner: Runner, policy: ChunkingPolicy, sampler: InitialConditionSampler,
                   sampling: GroupSampling, info, video_dir: Path | None = None, process_group=None) -> dict:
    """Dynamic sampling: groups of K rollouts per initial condition, streamed in draw order, until this rank
    holds its share of B informative groups (the first groups in draw order that settle it; the sampler learns
    from exactly those, later ones are cancelled or ignored) or has drawn ``sampling.most_groups``; the groups
    kept over all ranks are counted over ``process_group`` (the default one unless given). With ``video_dir``,
    the first rollout is recorded there as an mp4."""
    k = sampling.k
    need = sampling.local_groups(info.world_size)
    stream = GroupStream(sampler.draws(), k, need, sampling.most_groups(need, sampler, runner.env_slots),
                         sampling.mixed_only, video_dir is not None)
    results = runner.run(policy, video_dir=video_dir, specs=[], stop=stream)
    stream.satisfied()  # a run that drew its most groups and ran them all: every group counts
    kept, episodes = [], []
    counted = [e for e in results["episodes"] if e["episode"] // k < stream.settled]
    for group in group_episodes(counted, k):
        rewards = [float(e["success"]) for e in group]
        sampler.record((group[0]["task"], group[0]["seed"]), rewards)
        episodes.extend(group)
        if sampling.keeps([e["success"] for e in group]):
            kept.append(group)
    t = time.perf_counter()
    total_kept = ddist.all_sum([len(kept)], info, process_group)[0]
    sync = time.perf_counter() - t
    return {**results, "kept": kept, "episodes": episodes, "groups_drawn": len(stream.ended),
            "capped": total_kept < sampling.groups, "total_kept": total_kept, "sync": sync}


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
