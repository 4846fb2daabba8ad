"""A world model as the environment: episodes that start from the simulator's real first observation and go on in
the model, a batch of envs at a time, whole action chunks per step, ending when the model's success head says the
task is done or at the horizon. ``ImaginedRunner`` answers the same ``run(policy, video_dir, specs, stop)`` as
``EnvRunner``, so RL's rollouts (and an imagined evaluation) run unchanged in it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from ript.envs.episodes import EpisodeQueue, StopRule, decision_counts, finished_episode, protocol_specs, video_frame
from ript.envs.worker_env import EpisodeSpec, PoolSettings, WorkerSet
from ript.errors import RiptError
from ript.policies.base import ChunkingPolicy
from ript.utils.video import write_mp4


class WorldModel(Protocol):
    """What the imagined env needs of a world model (``ript.models.world_model.WorldModel`` is one)."""
    chunk: int                 # actions per step
    image_keys: list[str]      # the cameras it predicts
    lowdim_keys: list[str]     # the low-dim keys it predicts
    noise_shape: tuple[int, ...] | None  # the standard normal noise a step draws per env; None: none

    def task_index(self, name: str) -> int: ...  # RiptError for a task it was not trained on

    def step(self, obs: dict[str, torch.Tensor], task_ids: torch.Tensor, actions: torch.Tensor,
             noise: torch.Tensor | None = None) -> tuple[dict[str, torch.Tensor], torch.Tensor]: ...
    # the next observations and success probabilities

    def eval(self) -> WorldModel: ...


class InitialFrames:
    """The first observation of each (task, seed) as the simulator starts that episode (a LIBERO init state, a
    MetaWorld layout), rendered once in env workers (kept until ``close``) and kept for every later episode."""

    def __init__(self, suite: str, render: dict, max_episode_steps: int, num_workers: int, pool: PoolSettings):
        self.settings = (suite, dict(render), max_episode_steps)
        self.num_workers, self.pool_settings = num_workers, pool
        self.frames: dict[tuple[str, int], dict[str, np.ndarray]] = {}
        self.workers: WorkerSet | None = None

    def __getitem__(self, key: tuple[str, int]) -> dict[str, np.ndarray]:
        return self.frames[key]

    def ensure(self, keys: list[tuple[str, int]]) -> None:
        """Render the first observations of ``keys`` not rendered yet, in parallel workers."""
        queue = sorted(set(keys) - set(self.frames), reverse=True)  # popped from the end, task by task
        if not queue:
            return
        if self.workers is None:
            self.workers = WorkerSet(*self.settings, self.num_workers, 1, 1, self.pool_settings)
        pool, in_flight = self.workers.pool, {}

        def send(w: int) -> None:
            key = queue.pop()
            in_flight[w] = key, pool.send(w, "begin", ([(0, EpisodeSpec(key[0], key[1], 0))],))

        for w in range(min(len(pool), len(queue))):
            send(w)
        while in_flight:
            for w in pool.ready({w: call for w, (_, call) in in_flight.items()}):
                key, call = in_flight.pop(w)
                results, _ = pool.receive(call)
                if results[w] is None:
                    queue.append(key)  # its worker died and was replaced: rendered again
                else:
                    self.frames[key] = self.workers.frames[w].get(results[w][0][1])
                if queue:
                    send(w)

    def close(self) -> None:
        if self.workers is not None:
            self.workers.close()
            self.workers = None


@dataclass(frozen=True)
class ImaginationOptions:
    """An imagined run: the tasks, the horizon, ``envs`` stepped together, the success head's threshold (None: every
    episode runs to the horizon, as ``ript world-model-calibrate`` runs them), and the
    evaluation protocol's episodes (``episodes_per_task`` from ``seed``, the first ``n_videos`` of each task
    recorded) when the caller passes none."""
    task_names: tuple[str, ...] | list[str]
    max_episode_steps: int
    envs: int
    success_threshold: float | None = 0.5  # None: no episode ends early (each records its head's peak)
    episodes_per_task: int = 1
    seed: int = 0
    n_videos: int = 0


class ImaginedRunner:
    def __init__(self, model: WorldModel, options: ImaginationOptions, initial: InitialFrames, device: str):
        self.model, self.options, self.initial, self.device = model.eval(), options, initial, torch.device(device)
        # a task the model was not trained on: one line, before any episode
        self.task_ids = {name: model.task_index(name) for name in options.task_names}
        self.keys = [*model.image_keys, *model.lowdim_keys]  # what it predicts, and all a policy then reads

    def use_model(self, model: WorldModel) -> None:
        """Go on in another world model of the same tasks, in the same order (a refreshed one)."""
        if {name: model.task_index(name) for name in self.options.task_names} != self.task_ids:
            raise RiptError("the refreshed world model numbers its tasks otherwise than the one it replaces")
        if self.model.sampling_steps is not None:  # drawn in as many steps as the one it replaces (a setting)
            model.set_denoise_steps(self.model.sampling_steps)
        self.model = model.eval()

    @property
    def env_slots(self) -> int:
        return int(self.options.envs)

    @property
    def shaped_reward(self) -> str | None:
        return "a world model (it predicts success only)"

    def specs(self) -> list[EpisodeSpec]:
        o = self.options
        return protocol_specs(o.task_names, o.episodes_per_task, o.seed, o.n_videos)

    def run(self, policy: ChunkingPolicy, video_dir: Path | None = None, specs: list[EpisodeSpec] | None = None,
            stop: StopRule | None = None, sink: Callable[[dict], None] | None = None) -> dict[str, Any]:
        """Every episode of ``specs`` (default: the evaluation protocol) in the world model, or until ``stop`` is
        satisfied; the same results as ``EnvRunner.run`` (the episodes, env steps, timings)."""
        specs = self.specs() if specs is None else list(specs)
        if sink is not None or any(spec.keep for spec in specs):
            raise RiptError("episodes are kept as demonstration files from the simulator only (environment=simulator)")
        if policy.action_horizon % self.model.chunk:
            raise RiptError(f"the policy executes {policy.action_horizon} actions per decision; the world model "
                            f"steps {self.model.chunk} at a time (set the decoding's action_horizon to a multiple)")
        t0 = time.perf_counter()
        episodes = Episodes(self, policy, specs, video_dir, stop)
        startup = time.perf_counter() - t0
        episodes.run()
        return episodes.summary(startup)

    def close(self) -> None:
        self.initial.close()


class Episodes:
    """One imagined run: env slots take episodes as they free up; each round plans every running env's chunk in
    one batched call and steps them all together in the world model."""

    def __init__(self, runner: ImaginedRunner, policy: ChunkingPolicy, specs: list[EpisodeSpec],
                 video_dir: Path | None, stop: StopRule | None):
        self.runner, self.policy, self.model, self.video_dir, self.stop = runner, policy, runner.model, video_dir, stop
        n = runner.env_slots
        # each episode's first frame is rendered in the simulator before it can start
        self.queue = EpisodeQueue(specs, stop, lambda new: runner.initial.ensure([(s.task_name, s.seed) for s in new]))
        self.running: list[EpisodeSpec | None] = [None] * n
        self.steps, self.rewards = [0] * n, [[] for _ in range(n)]
        self.peak = [0.0] * n  # the success head's highest probability so far in each running episode
        self.frames: list[list[np.ndarray]] = [[] for _ in range(n)]
        self.current: list[dict[str, np.ndarray] | None] = [None] * n
        # a model that draws noise draws each episode's from a stream of its own, seeded by the episode's name as
        # the policy's is: an episode imagines the same whichever slot and batch it runs in, and resumes exactly
        self.noise_streams: list[torch.Generator | None] = [None] * n
        self.episodes: list[dict] = []
        self.cancelled, self.env_steps, self.decisions = 0, 0, 0
        self.model_s, self.t0 = 0.0, time.perf_counter()
        self.video_keys = list(self.model.image_keys)
        self.before = (policy.inference_seconds, policy.plan_calls)

    def run(self) -> None:
        self.policy.reset(len(self.running))
        while True:
            self.queue.has_next(sum(spec is None for spec in self.running))  # the free slots' first frames at once
            for s in range(len(self.running)):
                if self.running[s] is None and self.queue.has_next():
                    self.begin(s, self.queue.take())
            active = [spec is not None for spec in self.running]
            if not any(active):
                break
            self.advance(active)
            if self.stop is not None and self.stop.satisfied():
                self.cancel()
                break
        if len(self.episodes) + self.cancelled != self.queue.total:
            raise RuntimeError(f"imagined run finished {len(self.episodes)} episodes of {self.queue.total}")

    def begin(self, s: int, spec: EpisodeSpec) -> None:
        first = self.runner.initial[(spec.task_name, spec.seed)]
        missing = [k for k in self.runner.keys if k not in first]
        if missing:
            raise RiptError(f"the simulator's observations have no {missing[0]}, which the world model predicts "
                            f"(it observes {', '.join(sorted(first))})")
        obs = {k: first[k] for k in self.runner.keys}
        self.running[s], self.steps[s], self.rewards[s], self.current[s] = spec, 0, [], obs
        self.peak[s] = 0.0
        if self.model.noise_shape is not None:
            self.noise_streams[s] = torch.Generator(self.runner.device).manual_seed(spec.key)
        self.frames[s] = [video_frame(obs, self.video_keys)] if spec.record else []
        self.policy.reset_env(s, spec.task_name, spec.key)
        self.policy.observe(s, obs)

    def advance(self, active: list[bool]) -> None:
        """Every running env's next chunk, stepped in the world model ``chunk`` actions at a time; an env stops at
        the step its success head fires or at the horizon."""
        chunks = self.policy.act_chunk(active)
        envs = [s for s, a in enumerate(active) if a]
        self.decisions += len(envs)
        t0 = time.perf_counter()
        dev, c, horizon = self.runner.device, self.model.chunk, self.runner.options.max_episode_steps
        keys = self.runner.keys
        obs = {k: torch.from_numpy(np.stack([self.current[s][k] for s in envs])).to(dev) for k in keys}
        actions = torch.from_numpy(np.stack([chunks[s] for s in envs])).to(dev)
        task_ids = torch.tensor([self.runner.task_ids[self.running[s].task_name] for s in envs], device=dev)
        left = torch.tensor([horizon - self.steps[s] for s in envs], device=dev)
        taken = torch.zeros(len(envs), dtype=torch.long, device=dev)
        success = torch.zeros(len(envs), dtype=torch.bool, device=dev)
        peak = torch.zeros(len(envs), device=dev)
        threshold = self.runner.options.success_threshold
        recorded: list[list[dict[str, np.ndarray]]] = [[] for _ in envs]
        for j in range(actions.shape[1] // c):
            alive = ~success & (taken < left)
            if not bool(alive.any()):
                break
            nxt, prob = self.model.step(obs, task_ids, actions[:, j * c:(j + 1) * c], self.noise(envs))
            obs = {k: torch.where(alive.view(-1, *[1] * (v.dim() - 1)), nxt[k].to(v.dtype), v) for k, v in obs.items()}
            taken += torch.minimum(torch.full_like(left, c), left - taken) * alive
            peak = torch.maximum(peak, torch.where(alive, prob.float(), 0.0))
            if threshold is not None:
                success |= alive & (prob >= threshold)
            for e, s in enumerate(envs):
                if self.running[s].record and bool(alive[e]):
                    recorded[e].append({k: v[e].cpu().numpy() for k, v in obs.items()})
        host = {k: v.cpu().numpy() for k, v in obs.items()}
        self.model_s += time.perf_counter() - t0
        self.after_chunk(envs, host, taken.tolist(), success.tolist(), recorded, peak.tolist())

    def noise(self, envs: list[int]) -> torch.Tensor | None:
        """One world-model step's noise for ``envs``, each env's from its episode's stream (None: none drawn)."""
        shape = self.model.noise_shape
        if shape is None:
            return None
        return torch.stack([torch.randn(shape, device=self.runner.device, generator=self.noise_streams[s])
                            for s in envs])

    def after_chunk(self, envs: list[int], host: dict[str, np.ndarray], taken: list[int], success: list[bool],
                    recorded: list[list[dict]], peak: list[float]) -> None:
        ended = []
        for e, s in enumerate(envs):
            self.peak[s] = max(self.peak[s], peak[e])
            self.current[s] = {k: v[e] for k, v in host.items()}
            self.steps[s] += taken[e]
            self.env_steps += taken[e]
            self.rewards[s].append(float(success[e]))
            self.frames[s].extend(video_frame(o, self.video_keys) for o in recorded[e])
            self.policy.observe(s, self.current[s])
            if success[e] or self.steps[s] >= self.runner.options.max_episode_steps:
                ended.append((s, success[e]))
        if self.policy.record:
            self.policy.bootstrap([s for s, won in ended if not won])
        for s, won in ended:
            self.finish(s, won)

    def finish(self, s: int, success: bool) -> None:
        spec = self.running[s]
        episode = finished_episode(spec, success, self.steps[s], self.policy, s, self.rewards[s])
        episode["success_peak"] = self.peak[s]  # any threshold at or below it would have ended it with success
        if spec.record and self.video_dir is not None:
            tag = "success" if success else "failure"
            write_mp4(Path(self.video_dir) / f"{spec.task_name}_ep{spec.index}_{tag}_imagined.mp4", self.frames[s])
        self.episodes.append(episode)
        self.running[s], self.frames[s] = None, []
        if self.stop is not None:
            self.stop.finished(episode)

    def cancel(self) -> None:
        self.cancelled += self.queue.clear()
        for s, spec in enumerate(self.running):
            if spec is not None:
                if self.policy.record:
                    self.policy.take_record(s)
                self.running[s], self.frames[s] = None, []
                self.cancelled += 1

    def summary(self, startup_s: float) -> dict[str, Any]:
        seconds = time.perf_counter() - self.t0
        inference, calls = self.before
        return {"episodes": sorted(self.episodes, key=lambda e: (e["task"], e["seed"], e["episode"])),
                "env_steps": self.env_steps, "seconds": seconds,
                "env_steps_per_second": self.env_steps / max(seconds, 1e-9), "first_frames": {}, "reruns": 0,
                "dropped": 0, "cancelled": self.cancelled, "worker_restarts": 0, "startup_seconds": startup_s,
                "task_build_seconds": 0.0, "task_build_share": 0.0,
                "worker_busy_share": self.model_s / max(seconds, 1e-9),
                "policy_share": (self.policy.inference_seconds - inference) / max(seconds, 1e-9),
                "driver_idle_share": 0.0,  # the world model steps in this process: nothing to wait for
                "decisions_per_plan": self.decisions / max(1, self.policy.plan_calls - calls),
                **decision_counts(self.decisions, self.policy.plan_calls - calls, len(self.running))}
