"""Initial conditions for RL: (task, layout seed) pairs, group g of iteration i drawn from its own seeded
stream, optionally skipping ones the policy mastered (all K rollouts succeeded) in recent iterations, and
optionally drawing tasks in proportion to the chance that a group of K rollouts on them is informative. Its
estimates are checkpointed."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from ript.envs.seeds import rl_layout_seed

UNSEEN_SUCCESS = 0.5  # the success estimate a task no group has been recorded for counts as


class InitialConditionSampler:
    def __init__(self, task_names: list[str], seed: int, pool_size: int = 1000, skip_mastered_for: int = 0,
                 task_weighting: str = "uniform", k: int = 8, ema: float = 0.7, floor: float = 0.01,
                 prior: bool = False):
        if task_weighting not in ("uniform", "informative"):
            raise ValueError(f"rl.task_weighting={task_weighting!r}: expected 'uniform' or 'informative'")
        self.task_names = list(task_names)
        self.pool_size = pool_size
        self.skip_mastered_for = skip_mastered_for
        self.task_weighting, self.k, self.ema, self.floor = task_weighting, k, ema, floor
        # True: a task's running estimates (success, mixed share) start where an unseen task's are and each group
        # moves them one EMA step; False: its first group sets them. A group's K rollouts share one layout, so one
        # all-failed group of a task at 20% is common, and setting its success to 0 starves it at the floor
        self.prior = prior
        self.seed = seed
        self.mastered: dict[str, int] = {}  # "task|seed" -> iteration it was last mastered
        self.success: dict[str, float] = {}  # task -> running estimate of rollout success
        self.mixed: dict[str, float] = {}  # task -> running share of its groups that came out mixed
        self.iteration = 0

    def start_iteration(self, iteration: int) -> None:
        """Initial conditions mastered within ``skip_mastered_for`` iterations of this one are skipped."""
        self.iteration = iteration

    def task_probabilities(self) -> np.ndarray:
        """``informative``: P(a group of K is mixed) = 1 - p^K - (1-p)^K under each task's success estimate p,
        floored at ``floor``; unseen tasks count as p = 0.5."""
        if self.task_weighting == "uniform":
            return np.full(len(self.task_names), 1.0 / len(self.task_names))
        p = np.array([self.success.get(t, UNSEEN_SUCCESS) for t in self.task_names])
        w = np.maximum(1.0 - p**self.k - (1.0 - p) ** self.k, self.floor)
        return w / w.sum()

    @property
    def unseen_mixed(self) -> float:
        """The chance a group of K on an unseen task is mixed, as K coin flips at its success estimate give it."""
        return 1.0 - UNSEEN_SUCCESS**self.k - (1.0 - UNSEEN_SUCCESS) ** self.k

    def informative_share(self) -> float:
        """The expected share of drawn groups that come out mixed (some of K succeed, some fail): each task's
        observed share (unseen: 1 - p^K - (1-p)^K at p = 0.5) weighted by the probability it is drawn with. The
        observed share, not the binomial one from the task's success rate: outcomes depend on the layout, so a
        task at 50% success has far fewer mixed groups than K independent coin flips would give (measured)."""
        mixed = np.array([self.mixed.get(t, self.unseen_mixed) for t in self.task_names])
        return float(np.dot(self.task_probabilities(), mixed))

    def draws(self) -> GroupDraws:
        """This iteration's draws, from the estimates as they stand: group g's initial condition depends on
        (seed, iteration, g) only, so it is the same however many groups are drawn or when."""
        recent = self.skip_mastered_for
        skipped = frozenset(key for key, last in self.mastered.items() if recent and self.iteration - last <= recent)
        return GroupDraws(tuple(self.task_names), tuple(self.task_probabilities().tolist()), self.seed,
                          self.iteration, self.pool_size, skipped)

    def record(self, ic: tuple[str, int], rewards: list[float]) -> None:
        self._running(self.success, ic[0], float(np.mean(rewards)), UNSEEN_SUCCESS)
        self._running(self.mixed, ic[0], float(len(set(rewards)) > 1), self.unseen_mixed)
        if self.skip_mastered_for and min(rewards) >= 1.0:
            self.mastered[f"{ic[0]}|{ic[1]}"] = self.iteration

    def _running(self, estimates: dict[str, float], task: str, value: float, unseen: float) -> None:
        """One EMA step of a task's running estimate, from what an unseen task counts as (with the prior) or
        set by its first group (without)."""
        if task in estimates or self.prior:
            estimates[task] = self.ema * estimates.get(task, unseen) + (1 - self.ema) * value
        else:
            estimates[task] = value

    def state_dict(self) -> dict:
        return {"seed": self.seed, "mastered": json.dumps(self.mastered),
                "success": json.dumps(self.success), "mixed": json.dumps(self.mixed), "iteration": self.iteration}

    def load_state_dict(self, state: dict) -> None:
        self.seed = int(state.get("seed", self.seed))  # a checkpoint of a sequential stream has none
        self.mastered = json.loads(state["mastered"])
        self.success = json.loads(state["success"])
        self.mixed = json.loads(state.get("mixed", "{}"))  # checkpoints before rl.oversample have none
        self.iteration = int(state["iteration"])


@dataclass(frozen=True)
class GroupDraws:
    """One iteration's initial conditions, group by group: the task from the iteration's task probabilities and a
    layout from the pool, skipping those mastered recently (up to ``max_tries`` draws)."""
    task_names: tuple[str, ...]
    probabilities: tuple[float, ...]
    seed: int
    iteration: int
    pool_size: int
    skipped: frozenset[str]  # "task|layout seed" keys mastered within rl.skip_mastered_for iterations
    max_tries: int = 100

    def draw(self, group: int) -> tuple[str, int]:
        rng = np.random.default_rng([self.seed, self.iteration, group])
        for _ in range(self.max_tries):
            task = self.task_names[int(rng.choice(len(self.task_names), p=self.probabilities))]
            ic = (task, rl_layout_seed(int(rng.integers(self.pool_size))))
            if f"{ic[0]}|{ic[1]}" not in self.skipped:
                break
        return ic
