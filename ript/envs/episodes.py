"""What every runner shares: the ``Runner`` contract (the simulator's ``EnvRunner``, a world model's
``ImaginedRunner``), the stop rule a run may end early by, an ended episode's record and a video frame."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

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
