"""What every runner shares: the ``Runner`` contract (the simulator's ``EnvRunner``, a world model's
``ImaginedRunner``), the stop rule a run may end early by, an ended episode's record and a video frame."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ript.envs.seeds import eval_layout_seed
from ript.envs.worker_env import EpisodeSpec
from ript.policies.base import ChunkingPolicy


class StopRule:
    """Ends a run as soon as the episodes seen so far settle what the caller needs (RL's dynamic sampling:
    enough informative groups, in draw order); the episodes still running or waiting are then cancelled. A
    rule must decide from which episodes have ended, never from when, so the result does not depend on timing."""

    def finished(self, episode: dict) -> None:
        raise NotImplementedError

    def dropped(self, spec: EpisodeSpec) -> None:
        """An episode lost with its worker (``on_worker_failure="drop"``)."""
        raise NotImplementedError

    def satisfied(self) -> bool:
        raise NotImplementedError

    def more(self) -> list[EpisodeSpec]:
        """Episodes to run after every one given so far has started, asked for whenever an env slot is free and
        none is waiting (RL's stream of groups); [] (the default): none. The rule's own state decides them, never
        the time they are asked for."""
        return []


class EpisodeQueue:
    """The episodes of a run not started yet, in the caller's order: the given ones, then those the stop rule
    streams (``StopRule.more``) once they have all started. ``on_new`` sees every spec before it can start."""

    def __init__(self, specs: list[EpisodeSpec], stop: StopRule | None,
                 on_new: Callable[[list[EpisodeSpec]], None] | None = None):
        self.stop, self.on_new = stop, on_new
        self.waiting: list[EpisodeSpec] = []  # popped from the end
        self.total = 0  # every spec queued, given or streamed
        self.add(list(specs))

    def add(self, specs: list[EpisodeSpec]) -> None:
        if specs and self.on_new is not None:
            self.on_new(specs)
        self.waiting[:0] = reversed(specs)
        self.total += len(specs)

    def has_next(self, want: int = 1) -> bool:
        """Whether an episode waits, asking the stop rule for more until ``want`` do (or it has none)."""
        if len(self.waiting) < want and self.stop is not None:
            streamed: list[EpisodeSpec] = []
            while len(self.waiting) + len(streamed) < want:
                more = self.stop.more()
                if not more:
                    break
                streamed += more
            self.add(streamed)  # at once: on_new may prepare them together
        return bool(self.waiting)

    def take(self, prefer: Callable[[EpisodeSpec], bool] | None = None) -> EpisodeSpec:
        """The next episode, or the first waiting one ``prefer`` accepts (call ``has_next`` first)."""
        j = len(self.waiting) - 1
        if prefer is not None:
            j = next((i for i in range(len(self.waiting) - 1, -1, -1) if prefer(self.waiting[i])), j)
        return self.waiting.pop(j)

    def put_back(self, spec: EpisodeSpec) -> None:
        """An episode to run again (its worker failed): it starts next."""
        self.waiting.append(spec)

    def clear(self) -> int:
        """Nothing more starts (the stop rule is satisfied): how many waiting episodes that cancels."""
        n = len(self.waiting)
        self.waiting.clear()
        return n


class Runner(Protocol):
    """What runs a policy's episodes: the simulator's env workers (``EnvRunner``) or a world model
    (``ript.envs.imagination.ImaginedRunner``)."""

    @property
    def env_slots(self) -> int:
        """Episodes that run at once."""
        ...

    @property
    def shaped_reward(self) -> str | None:
        """What gives no shaped (dense) step reward, to say so (None: it has one)."""
        ...

    def specs(self) -> list[EpisodeSpec]:
        """The evaluation protocol's episodes."""
        ...

    def run(self, policy: ChunkingPolicy, video_dir: Path | None = None, specs: list[EpisodeSpec] | None = None,
            stop: StopRule | None = None, sink: Callable[[dict], None] | None = None) -> dict[str, Any]:
        """Every episode of ``specs`` (default: the evaluation protocol), or until ``stop`` is satisfied; ``sink``
        takes each finished episode whose spec keeps its steps, with them under ``steps``."""
        ...

    def close(self) -> None: ...


def protocol_specs(task_names: list[str] | tuple[str, ...], episodes_per_task: int, seed: int,
                   n_videos: int) -> list[EpisodeSpec]:
    """The evaluation protocol's episodes: ``episodes_per_task`` layouts per task from ``seed``, the first
    ``n_videos`` of each task recorded, tasks interleaved so that workers share the slow ones."""
    return [EpisodeSpec(t, eval_layout_seed(seed, j), j, j < n_videos)
            for j in range(episodes_per_task) for t in task_names]


def repeated_layouts(specs: list[EpisodeSpec], draws: int) -> list[EpisodeSpec]:
    """``specs`` with each run of ``draws`` consecutive episodes of a task (by index) on the layout of the first of
    them: the same start under ``draws`` policy-noise streams (each episode keeps its index, which seeds its
    noise), so that how much of an outcome its start decides can be read off the simulator itself."""
    if draws < 1:
        raise ValueError(f"draws={draws}: expected 1 or more")
    first = {(s.task_name, s.index): s.seed for s in specs}
    missing = [s for s in specs if (s.task_name, s.index - s.index % draws) not in first]
    if missing:
        raise ValueError(f"episode {missing[0].index} of {missing[0].task_name}: no episode "
                         f"{missing[0].index - missing[0].index % draws} of its task to share a layout with")
    return [dataclasses.replace(s, seed=first[(s.task_name, s.index - s.index % draws)]) for s in specs]


def finished_episode(spec: EpisodeSpec, success: bool, length: int, policy: ChunkingPolicy, env: int,
                     chunk_rewards: list[float]) -> dict[str, Any]:
    """An ended episode as a run returns it; with a recording policy, its decisions and each one's reward."""
    episode = {"task": spec.task_name, "episode": spec.index, "seed": spec.seed, "success": bool(success),
               "length": length}
    if policy.record:
        episode["decisions"] = policy.take_record(env)
        episode["chunk_rewards"] = chunk_rewards
    return episode


def video_frame(obs: dict[str, np.ndarray], keys: list[str]) -> np.ndarray:
    return np.concatenate([obs[k] for k in keys], axis=1)


def decision_counts(decisions: int, rounds: int, batch_rows: int) -> dict[str, float]:
    """A run's batched decisions: how many rounds the policy was called for, and the share of the rows it paid for
    (``batch_rows`` a call, full or not) that held a running env: a run's last rounds, with few episodes left to
    finish, fill little of their batches."""
    return {"decisions": decisions, "decision_rounds": rounds, "decision_rows": rounds * batch_rows,
            "slot_occupancy": decisions / max(1, rounds * batch_rows)}
