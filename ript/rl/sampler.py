"""Initial conditions for RL: (task, layout seed) pairs drawn from a seeded stream, optionally skipping
ones the policy mastered (all K rollouts succeeded) in recent iterations. Its state is checkpointed."""

from __future__ import annotations

import json

import numpy as np

RL_SEED_BASE = 3 * 10**9  # disjoint from demonstration (< 10**9) and evaluation (10**9 + ...) layouts


class InitialConditionSampler:
    def __init__(self, task_names: list[str], seed: int, pool_size: int = 1000, skip_mastered_for: int = 0):
        self.task_names = list(task_names)
        self.pool_size = pool_size
        self.skip_mastered_for = skip_mastered_for
        self.rng = np.random.default_rng(seed)
        self.mastered: dict[str, int] = {}  # "task|seed" -> iteration it was last mastered
        self.iteration = 0

    def draw(self, n: int, max_tries: int = 100) -> list[tuple[str, int]]:
        out = []
        for _ in range(n):
            for _ in range(max_tries):
                task = self.task_names[int(self.rng.integers(len(self.task_names)))]
                ic = (task, RL_SEED_BASE + int(self.rng.integers(self.pool_size)))
                last = self.mastered.get(f"{ic[0]}|{ic[1]}")
                if last is None or self.iteration - last > self.skip_mastered_for:
                    break
            out.append(ic)
        return out

    def record(self, ic: tuple[str, int], rewards: list[float]) -> None:
        if self.skip_mastered_for and min(rewards) >= 1.0:
            self.mastered[f"{ic[0]}|{ic[1]}"] = self.iteration

    def state_dict(self) -> dict:
        return {"rng": json.dumps(self.rng.bit_generator.state), "mastered": json.dumps(self.mastered),
                "iteration": self.iteration}

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = json.loads(state["rng"])
        self.mastered = json.loads(state["mastered"])
        self.iteration = int(state["iteration"])
