"""A small policy written only against ``ript/policies/base.py``, for tests that drive the env runner with real
simulators and need no trained model."""

import numpy as np
import torch

from ript.policies.base import ChunkingPolicy


class NoisyHold(ChunkingPolicy):
    """Small seeded random motions from each episode's own noise stream, around a fixed action per task
    (``pushes``; none: holding still); records the arm states each decision read (its frame stack)."""

    def __init__(self, seed: int = 0, action_horizon: int = 5, frame_stack: int = 2, noise: float = 0.2,
                 pushes: dict[str, np.ndarray] | None = None):
        super().__init__(action_dim=4, action_horizon=action_horizon, frame_stack=frame_stack, device="cpu",
                         seed=seed, obs_keys=["robot_states"])
        self.noise, self.pushes = noise, pushes or {}

    def reset(self, n_envs: int, block: int | None = None) -> None:
        super().reset(n_envs, block)
        self.tasks = [""] * n_envs

    def start_task(self, i: int, task_name: str) -> None:
        self.tasks[i] = task_name

    def plan(self, envs: list[int]) -> np.ndarray:
        noise = self.env_draws(envs, lambda g: torch.randn(self.action_horizon, self.action_dim, generator=g))
        base = np.stack([self.pushes.get(self.tasks[i], np.zeros(self.action_dim, np.float32)) for i in envs])
        if self.record:
            for i in envs:
                self.records[i].append({"task": self.tasks[i],
                                        "stack": np.stack([f["robot_states"] for f in self.history[i]])})
        return (base[:, None] + self.noise * noise.numpy()).clip(-1, 1)
