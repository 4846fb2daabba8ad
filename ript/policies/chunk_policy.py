"""The policy interface the env runners drive, and its chunk-policy implementation.

A runner owns ``n`` envs. For each env the policy keeps the last ``frame_stack`` observations and a queue
of planned actions; ``act`` refills the empty queues of all active envs with one batched model call and
pops one action per env. ``wants_obs(i)`` tells the runner whether env i's next observation will be read,
so images are rendered only for the frames a decision uses.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Protocol

import numpy as np
import torch

from ript.models.prior import SkillPrior


class Policy(Protocol):
    action_dim: int

    def reset(self, n_envs: int) -> None: ...
    def reset_env(self, i: int, task_name: str) -> None: ...
    def wants_obs(self, i: int) -> bool: ...
    def observe(self, i: int, obs: dict[str, np.ndarray]) -> None: ...
    def act(self, active: list[bool]) -> np.ndarray: ...


class ChunkPolicy:
    def __init__(
        self,
        model: SkillPrior,
        action_horizon: int = 8,
        temperature: float = 1.0,
        top_k: int | None = None,
        greedy: bool = False,
        device: str | torch.device = "cpu",
        seed: int = 0,
        amp: bool = False,
        record: bool = False,
    ):
        chunk = model.autoencoder.chunk_size
        if not 1 <= action_horizon <= chunk:
            raise ValueError(f"action_horizon={action_horizon} must be in [1, chunk_size={chunk}]")
        self.model = model.eval().to(device)
        self.device = torch.device(device)
        self.action_dim = model.autoencoder.action_dim
        self.action_horizon = action_horizon
        self.decision_period = action_horizon  # runners align episode starts to this
        self.sample_kwargs = {"temperature": temperature, "top_k": top_k, "greedy": greedy}
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.amp = amp and self.device.type == "cuda"
        self.obs_keys = model.image_keys + model.lowdim_keys
        self.record = record
        self.inference_seconds = 0.0
        self.reset(0)

    def reset(self, n_envs: int) -> None:
        self.history: list[deque] = [deque(maxlen=self.model.frame_stack) for _ in range(n_envs)]
        self.queues: list[deque] = [deque() for _ in range(n_envs)]
        self.task_ids = [0] * n_envs
        self.records: list[list[dict]] = [[] for _ in range(n_envs)]

    def reset_env(self, i: int, task_name: str) -> None:
        self.history[i].clear()
        self.queues[i].clear()
        self.records[i] = []
        self.task_ids[i] = self.model.task_index(task_name)

    def wants_obs(self, i: int) -> bool:
        # called after this step's action was popped: the next decision comes once the queue is empty,
        # and the obs this step returns is in that decision's frame stack if fewer than frame_stack remain
        return len(self.queues[i]) < self.model.frame_stack

    def observe(self, i: int, obs: dict[str, np.ndarray]) -> None:
        frame = {k: obs[k] for k in self.obs_keys}
        if not self.history[i]:
            for _ in range(self.model.frame_stack - 1):
                self.history[i].append(frame)  # pad the start of an episode with its first frame
        self.history[i].append(frame)

    @torch.no_grad()
    def plan(self, envs: list[int]) -> None:
        t0 = time.perf_counter()
        obs = {
            k: torch.from_numpy(np.stack([np.stack([f[k] for f in self.history[i]]) for i in envs])).to(self.device)
            for k in self.obs_keys
        }
        task_ids = torch.tensor([self.task_ids[i] for i in envs], device=self.device)
        model = self.model
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
            context = model.context(obs, task_ids)
            tokens, log_probs = model.sample(context, generator=self.generator, **self.sample_kwargs)
            chunks = model.autoencoder.action_normalizer.unnormalize(model.autoencoder.decode_indices(tokens).float())
        if self.record:
            # what RL training needs, so it recomputes only the prior: context, sampled tokens, old log-probs
            for j, i in enumerate(envs):
                self.records[i].append({"context": context[j].float(), "tokens": tokens[j], "log_probs": log_probs[j]})
        chunks = chunks[:, : self.action_horizon].float().cpu().numpy()
        for i, chunk in zip(envs, chunks):
            self.queues[i].extend(chunk)
        self.inference_seconds += time.perf_counter() - t0  # .cpu() above waited for the GPU

    def take_record(self, i: int) -> list[dict]:
        """The decisions of env i's episode so far (empty unless ``record``), handed over and cleared."""
        out, self.records[i] = self.records[i], []
        return out

    def act(self, active: list[bool]) -> np.ndarray:
        need = [i for i, a in enumerate(active) if a and not self.queues[i]]
        if need:
            self.plan(need)
        actions = np.zeros((len(active), self.action_dim), dtype=np.float32)
        for i, a in enumerate(active):
            if a:
                actions[i] = self.queues[i].popleft()
        return actions
