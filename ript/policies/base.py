"""The policy interface: everything an env runner or an RL learner calls on a policy, written down once.

A runner owns ``n`` envs and drives them in decision rounds. For each env the policy keeps the last
``frame_stack`` observations; ``act_chunk`` plans, in one batched call, a chunk of ``action_horizon`` actions
for every active env and hands each chunk over whole; the runner executes a chunk inside its env worker and
passes back (``observe``) the frames the next decision reads. RL switches what differs from evaluation through
methods, never by setting fields: ``start_recording`` / ``stop_recording`` (the policy then keeps what RL needs of
each decision, ``take_record``; ``record`` reads the switch), ``attach_critic`` (decisions then record the
critic's value) and ``set_deterministic`` (the family's evaluation mode: its mode or mean instead of a sample).

Sampling noise comes from one stream per episode, seeded from the episode's key and a draw of the policy's
generator per run: an episode's actions depend on its own seed, not on which envs share its batch, how many
workers there are, or how the runner schedules them. Every policy family (the QueST-style prior, OpenVLA-OFT,
...; registered in ``ript.registry.POLICIES``, see ``ript.policies.families``) subclasses ``ChunkingPolicy``
and fills in ``start_task`` and ``plan``.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable

import numpy as np
import torch


class ChunkingPolicy(ABC):
    def __init__(self, action_dim: int, action_horizon: int, frame_stack: int, device: str | torch.device,
                 seed: int, obs_keys: list[str] | None = None):
        self.action_dim = action_dim
        self.action_horizon = action_horizon  # actions executed from each planned chunk before replanning
        self.frame_stack = frame_stack        # observations a decision reads (the runner renders only these)
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)  # one draw per run; checkpointed by RL
        self.obs_keys = obs_keys              # observation keys kept (None: all)
        self._record = False                  # keep what RL needs of every decision
        self._record_obs = False              # ... and each decision's observations (RL that trains the encoders)
        self._critic: torch.nn.Module | None = None  # a value head RL attaches: decisions then record "value"
        self._deterministic = False           # the family's evaluation mode instead of sampling
        self.inference_seconds = 0.0          # time spent in plan(), for the rollout's timing metrics
        self.plan_calls = 0                   # batched planning calls (decisions / calls: the mean batch)
        self.reset(0)

    def count_inference(self, seconds: float, calls: int) -> None:
        """Planning done for this policy by a copy of it elsewhere (a rollout actor), for the timing metrics."""
        self.inference_seconds += seconds
        self.plan_calls += calls

    @property
    def record(self) -> bool:
        """Whether decisions are recorded for RL (the runner reads it; ``start_recording`` sets it)."""
        return self._record

    @property
    def record_observations(self) -> bool:
        """Whether recorded decisions also keep their observations."""
        return self._record_obs

    @property
    def critic(self) -> torch.nn.Module | None:
        return self._critic

    @property
    def deterministic(self) -> bool:
        return self._deterministic

    def start_recording(self, observations: bool = False) -> None:
        """Keep what RL needs of every decision from now on; with ``observations``, also the decision's
        observations (an update that trains the observation encoders recomputes from them)."""
        self._record, self._record_obs = True, observations

    def stop_recording(self) -> None:
        self._record, self._record_obs = False, False

    def attach_critic(self, head: torch.nn.Module | None) -> None:
        """The value head whose value of each decision's state is recorded (None: no critic)."""
        self._critic = head

    def set_deterministic(self, on: bool) -> None:
        """Plan with the family's deterministic choice (the mode or mean of its action distribution, as it is
        evaluated) instead of sampling; RL samples."""
        self._deterministic = on

    def reset(self, n_envs: int, block: int | None = None) -> None:
        """A new run of ``n_envs`` envs (its episodes' noise streams key on a fresh draw of ``generator``), planned
        in blocks of ``block`` consecutive envs (None: all of them), each decision within one block."""
        self.block = block or max(n_envs, 1)
        self.history: list[deque] = [deque(maxlen=self.frame_stack) for _ in range(n_envs)]
        self.records: list[list[dict]] = [[] for _ in range(n_envs)]
        self.streams: list[torch.Generator | None] = [None] * n_envs
        self.run_key: int | None = None  # drawn when the run's first episode starts

    def reset_env(self, i: int, task_name: str, episode_key: int) -> None:
        """Env ``i`` starts an episode of ``task_name``; ``episode_key`` (``EpisodeSpec.key``) names the
        episode within the run and seeds its noise stream."""
        if self.run_key is None:
            self.run_key = int(torch.randint(0, 2**62, (1,), generator=self.generator, device=self.device))
        self.history[i].clear()
        self.records[i] = []
        seed = (self.run_key ^ (episode_key * 0x9E3779B97F4A7C15)) & (2**63 - 1)
        self.streams[i] = torch.Generator(device=self.device).manual_seed(seed)
        self.start_task(i, task_name)

    def env_draws(self, envs: list[int], draw: Callable[[torch.Generator], torch.Tensor]) -> torch.Tensor:
        """``draw(stream)`` for each env's episode stream, stacked: the sampling noise of one batched decision."""
        return torch.stack([draw(self.streams[i]) for i in envs])

    def observe(self, i: int, obs: dict[str, np.ndarray]) -> None:
        frame = obs if self.obs_keys is None else {k: obs[k] for k in self.obs_keys}
        if not self.history[i]:
            for _ in range(self.frame_stack - 1):
                self.history[i].append(frame)  # pad the start of an episode with its first frame
        self.history[i].append(frame)

    def act_chunk(self, active: list[bool]) -> list[np.ndarray | None]:
        """A chunk of ``action_horizon`` actions (float32, (horizon, action_dim)) for every active env, from one
        batched ``plan`` per block (``reset``); None for the others."""
        envs = [i for i, a in enumerate(active) if a]
        out: list[np.ndarray | None] = [None] * len(active)
        if envs:
            t0 = time.perf_counter()
            if self.record and not self.fixed_layout:
                # RL's ratio uses the recorded log-probs bit for bit and a batch's composition moves their last
                # bits; which envs are planned together is the runner's timing, so each env is planned alone
                batches = [[i] for i in envs]
            else:
                batches = [[i for i in envs if i // self.block == b] for b in sorted({i // self.block for i in envs})]
            chunks = np.concatenate([self.plan(batch) for batch in batches])
            self.inference_seconds += time.perf_counter() - t0
            self.plan_calls += 1
            for i, chunk in zip(envs, chunks):
                out[i] = np.asarray(chunk[: self.action_horizon], dtype=np.float32)
        return out

    @property
    def fixed_layout(self) -> bool:
        """Whether ``plan`` gives each env the same result whichever envs share its batch (a family that lays
        its batch out by env index says so); a recording run of a policy without it plans each env alone."""
        return False

    def take_record(self, i: int) -> list[dict]:
        """The decisions of env i's episode so far (empty unless ``record``), handed over and cleared."""
        out, self.records[i] = self.records[i], []
        return out

    @torch.no_grad()
    def bootstrap(self, envs: list[int]) -> None:
        """These envs' episodes were cut by the time limit (their frame stacks hold the last observations): with
        a critic, record its value of that state as the last decision's ``bootstrap_value``, so the return can
        go on past the cut. Without one nothing is needed."""
        if self.critic is None or not envs:
            return
        values = self.state_values(envs)
        for j, i in enumerate(envs):
            self.records[i][-1]["bootstrap_value"] = values[j].float().cpu()

    def state_values(self, envs: list[int]) -> torch.Tensor:
        """The critic's values (len(envs),) of these envs' current frame stacks; families with a critic fill it in."""
        raise NotImplementedError(f"{type(self).__name__} has a critic but does not compute state values")

    @abstractmethod
    def start_task(self, i: int, task_name: str) -> None:
        """Condition env ``i`` on its task (a task embedding, a prompt); an unknown task is a RiptError."""

    @abstractmethod
    def plan(self, envs: list[int]) -> np.ndarray:
        """(len(envs), >= action_horizon, action_dim) actions from the envs' frame stacks; appends to
        ``self.records[i]`` what RL needs when ``self.record`` is on. Waits for the device before returning."""
