"""Env runner: evaluates a policy on episodes of one or more tasks in parallel worker processes.

Workers are replaceable processes (``envs/workers.py``), each hosting ``envs_per_worker`` env slots
(``envs/worker_env.py``) and driven through two calls: ``begin`` (start episodes: task, seed) and ``advance``
(each env's whole chunk of actions; images only for the frames the next decision reads, through shared
memory). A worker that answers with idle slots starts its next episodes at once, so a slow reset or a task
being built holds up no other worker. The workers form ``pipeline_stages`` groups; a group's running envs are
planned in one batch of fixed size once none of its workers is still advancing, so that one group's decision
runs while the others simulate (the policy pays for a whole batch per call, full or not; with the simulators
rendering on the policy's GPU, one group, lock-step, is faster). A slot keeps its simulator tasks built (one
built scene serves every task of that scene, ``Suite.scene_of``) and takes the next episode of a task it has built
while one is left. Each episode samples from its own noise stream, so neither the
schedule nor the batch nor the slot an episode lands in changes it. A worker that dies
or hangs is replaced; its episodes are run again from their seeds (``on_worker_failure="rerun"``,
evaluation) or dropped (``"drop"``, RL), and the results count both.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ript.envs.episodes import EpisodeQueue, StopRule, decision_counts, finished_episode, protocol_specs, video_frame
from ript.envs.gl import renders_apart
from ript.envs.suites import get_suite
from ript.envs.worker_env import EpisodeSpec, PoolSettings, WorkerSet
from ript.envs.workers import Pending
from ript.policies.base import ChunkingPolicy
from ript.utils.logging import log
from ript.utils.processes import driver_threads
from ript.utils.video import write_mp4


def default_num_workers(requested: int | str | None, n_episodes: int, envs_per_worker: int = 1) -> int:
    if requested in (None, "auto"):
        requested = os.cpu_count() or 1
    return max(1, min(int(requested), -(-n_episodes // envs_per_worker)))


@dataclass(frozen=True)
class RunnerOptions:
    """What an env runner runs and how: the suite, its tasks and the render settings (those the policy's
    training images had); the episode horizon; ``episodes_per_task`` of the evaluation protocol (seeds from
    ``seed``, the first ``n_videos`` of each task recorded); ``num_workers`` processes ("auto": one per core, no
    more than the episodes need) of ``envs_per_worker`` env slots each; a worker that takes longer than
    ``pool.timeout_s`` or dies is replaced up to ``pool.max_restarts`` times, its episodes run again
    (``on_worker_failure="rerun"``) or dropped (``"drop"``); ``episodes_at_once``: the most episodes one run
    holds when the caller passes its own (RL's rounds), which bounds the workers worth starting;
    ``driver_threads``: torch threads of the driving process while the workers run (None: the cores they leave,
    at least one); ``pipeline_stages``: groups of workers planned in turn ("auto": 2 where the simulators render
    away from the policy's GPU, else 1); ``decisions``: "lockstep" plans a group's envs once none of them is still
    advancing, "as_ready" plans the waiting ones whenever the driving process is free."""
    suite: str
    task_names: tuple[str, ...] | list[str]
    render: dict
    max_episode_steps: int
    episodes_per_task: int
    num_workers: int | str | None = "auto"
    seed: int = 0
    n_videos: int = 0
    pool: PoolSettings = PoolSettings()  # how the workers run: this host's processes, or Ray actors
    on_worker_failure: str = "rerun"
    envs_per_worker: int = 1
    episodes_at_once: int | None = None
    driver_threads: int | None = None
    pipeline_stages: int | str = "auto"
    decisions: str = "lockstep"

    def __post_init__(self):
        if int(self.envs_per_worker) < 1:
            raise ValueError(f"envs_per_worker={self.envs_per_worker!r}: expected 1 or more")
        stages = self.pipeline_stages
        if stages != "auto" and not (isinstance(stages, int) and stages >= 1):
            raise ValueError(f"pipeline_stages={self.pipeline_stages!r}: expected 'auto' or 1 or more")
        if self.decisions not in ("lockstep", "as_ready"):
            raise ValueError(f"decisions={self.decisions!r}: expected lockstep or as_ready")
        if self.on_worker_failure not in ("rerun", "drop"):
            raise ValueError(f"on_worker_failure={self.on_worker_failure!r}: expected 'rerun' or 'drop'")


class EnvRunner:
    def __init__(self, options: RunnerOptions):
        self.options = options
        self.task_names = list(options.task_names)
        self.envs_per_worker = int(options.envs_per_worker)
        # no more workers than a run can use: the protocol's episodes, or what the caller runs at once (RL's rounds)
        at_once = options.episodes_per_task * len(self.task_names) if options.episodes_at_once is None \
            else int(options.episodes_at_once)
        self.num_workers = default_num_workers(options.num_workers, at_once, self.envs_per_worker)
        self.workers: WorkerSet | None = None
        self.slot_scenes: list[list[str]] = []  # set with the workers
        self.stages_logged = False  # what "auto" chose is said once per runner

    def specs(self) -> list[EpisodeSpec]:
        o = self.options
        return protocol_specs(self.task_names, o.episodes_per_task, o.seed, o.n_videos)

    def _ensure_workers(self, frames_per_env: int) -> WorkerSet:
        if self.workers is None:
            o = self.options
            self.workers = WorkerSet(o.suite, dict(o.render), o.max_episode_steps, self.num_workers,
                                     self.envs_per_worker, frames_per_env, o.pool)
            log.info("env runner: %d workers x %d envs, each env keeping up to %d built tasks",
                     self.num_workers, self.envs_per_worker, self.workers.task_limit)
            # the scenes each env slot has built, as its worker last reported (kept across runs, as the workers are)
            self.slot_scenes = [[] for _ in range(self.num_workers * self.envs_per_worker)]
        return self.workers

    @property
    def env_slots(self) -> int:
        return self.num_workers * self.envs_per_worker

    @property
    def shaped_reward(self) -> str | None:
        suite = self.options.suite
        return None if get_suite(suite).shaped_reward else f"suite {suite}"

    def run(self, policy: ChunkingPolicy, video_dir: Path | None = None, specs: list[EpisodeSpec] | None = None,
            stop: StopRule | None = None, sink: Callable[[dict], None] | None = None) -> dict[str, Any]:
        """Run every episode of ``specs`` (default: the evaluation protocol), or until ``stop`` is satisfied
        (the rest are then cancelled and counted): the episodes, the env steps and where the time went
        (``ript.evaluation.results.summarize`` adds the success rates). With a recording policy, each episode dict
        also carries its ``decisions``. An episode whose spec ``keep``s its steps renders every step and goes to
        ``sink`` with ``steps``: its observations before each action (one dict per step) and the actions (one row
        each)."""
        workers = self._ensure_workers(policy.frame_stack)
        with driver_threads(len(workers.pool), self.options.driver_threads):
            schedule = Schedule(policy, workers, self.slot_scenes, self.specs() if specs is None else list(specs),
                                video_dir, stop, [f"{c}_rgb" for c in self.options.render["cameras"]],
                                self.options.on_worker_failure == "rerun", sink, self.workers_per_stage(policy),
                                self.options.decisions == "as_ready")
            return schedule.run()

    def workers_per_stage(self, policy: ChunkingPolicy) -> int:
        stages = self.options.pipeline_stages
        if stages == "auto":
            # one stage's decision overlaps the others' simulation only where their rendering leaves the policy's
            # GPU alone (renders_apart); otherwise lock-step is faster
            apart = renders_apart(policy.device, self.workers.pool.render_gpus)
            stages = 2 if apart else 1
            if not self.stages_logged:
                log.info("env runner: %d workers planned in %d pipeline stage(s) (the simulators render %s)",
                         self.num_workers, min(stages, self.num_workers),
                         "on GPUs other than the policy's" if apart else "beside the policy, on its GPU or cores")
                self.stages_logged = True
        return -(-self.num_workers // min(int(stages), self.num_workers))

    def close(self) -> None:
        if self.workers is not None:
            self.workers.close()
            self.workers = None


class Schedule:
    """One run of episodes over the workers' env slots (slot s is env s % per of worker s // per).

    When a worker answers it gets its next call: episodes started at once, so a slow reset or a task being built
    holds up only its own worker; or its envs' next chunks, planned with its pipeline stage (``workers_per_stage``
    consecutive workers, one batch of the policy's) once no worker of the stage is still advancing (``as_ready``:
    as soon as the driving process is free). Episodes sample from their own noise streams and a stop rule decides
    from which episodes ended, so the schedule changes no result."""

    def __init__(self, policy: ChunkingPolicy, workers: WorkerSet, built: list[list[str]], specs: list[EpisodeSpec],
                 video_dir: Path | None, stop: StopRule | None, video_keys: list[str], rerun_failed: bool,
                 sink: Callable[[dict], None] | None = None, workers_per_stage: int | None = None,
                 as_ready: bool = False):
        self.policy, self.pool, self.shared, self.per = policy, workers.pool, workers.frames, workers.envs_per_worker
        self.scene_of = workers.scene_of
        self.built, self.video_dir, self.stop, self.video_keys = built, video_dir, stop, video_keys
        self.rerun_failed, self.keep = rerun_failed, policy.frame_stack
        self.n_workers = len(self.pool)
        self.per_stage = workers_per_stage or self.n_workers
        self.as_ready = as_ready  # plan a stage's waiting workers without waiting for its advancing ones
        self.waiting: set[int] = set()  # workers whose running envs wait for their stage's next decision
        n = self.n_workers * self.per
        self.queue = EpisodeQueue(specs, stop)
        self.running: list[EpisodeSpec | None] = [None] * n
        self.steps = [0] * n
        self.chunks: list = [None] * n
        self.rewards: list[list[float]] = [[] for _ in range(n)]  # each decision's chunk reward (the suite's own)
        self.frames: list[list] = [[] for _ in range(n)]
        self.sink, self.kept = sink, [None] * n  # kept: an episode's observations and actions, for the sink
        self.episodes: list[dict] = []
        self.first_frames: dict[str, np.ndarray] = {}  # task -> the cameras' first view of its episode 0 (a picture)
        self.in_flight: dict[int, Pending] = {}  # worker -> its call not yet answered (at most one each)
        self.env_steps = self.reruns = self.dropped = self.cancelled = self.decisions = 0
        self.build_s, self.startup_s, self.stopping = 0.0, None, False
        self.idle_s = 0.0  # the driving process waiting for any worker's answer

    def slots(self, w: int) -> range:
        return range(w * self.per, (w + 1) * self.per)

    def run(self) -> dict[str, Any]:
        policy, pool = self.policy, self.pool
        policy.reset(len(self.running), block=self.per_stage * self.per)
        self.t0 = time.perf_counter()
        before = (pool.restarts, pool.busy_s, policy.inference_seconds, policy.plan_calls)
        for w in range(self.n_workers):
            self.next_call(w)
        self.plan_stages()
        while self.in_flight:
            t = time.perf_counter()
            ready = pool.ready(self.in_flight)
            self.idle_s += time.perf_counter() - t
            for w in ready:
                self.receive(w)
            self.plan_stages()
        if len(self.episodes) + self.dropped + self.cancelled != self.queue.total:
            raise RuntimeError(f"runner finished {len(self.episodes)} episodes of {self.queue.total} ({self.dropped} "
                               f"dropped, {self.cancelled} cancelled)")
        return self.summary(*before)

    def receive(self, w: int) -> None:
        """Worker w's answer: its episodes started or advanced (or lost with a failed worker), then its next call
        (none yet if it waits for its stage's decision)."""
        call = self.in_flight.pop(w)
        results, failed = self.pool.receive(call)
        self.lost(failed)
        if results[w] is not None:
            (self.begun if call.name == "begin" else self.advanced)(w, results[w])
        if self.stop is not None and not self.stopping and self.stop.satisfied():
            self.stopping = True
            self.cancelled += self.queue.clear()
            for other in range(self.n_workers):
                if other not in self.in_flight and other != w:
                    self.cancel(other)  # workers with a call in flight are cancelled when they answer
            self.waiting.clear()
        self.next_call(w)

    def next_call(self, w: int) -> None:
        """Worker w has answered: start episodes on its idle slots, or plan its running ones' next chunks."""
        if self.stopping:
            self.cancel(w)
        elif any(self.running[s] is None for s in self.slots(w)) and self.queue.has_next():
            self.assign(w)
        elif any(self.running[s] is not None for s in self.slots(w)):
            self.waiting.add(w)

    def plan_stages(self) -> None:
        """Plan each stage whose waiting workers no longer wait on a stage-mate's chunk (``as_ready``: any waiting
        worker's stage); a worker starting episodes is not waited for: it joins the stage's next decision."""
        for first in range(0, self.n_workers, self.per_stage):
            stage = range(first, min(first + self.per_stage, self.n_workers))
            ready = [w for w in stage if w in self.waiting]
            if ready and (self.as_ready or not any(self.in_flight[w].name == "advance" for w in stage
                                                   if w in self.in_flight)):
                self.waiting.difference_update(ready)
                self.plan(ready)

    def send(self, w: int, name: str, items: dict[int, tuple]) -> None:
        """One call to worker w: its list of (env, *item) for the slots in ``items``."""
        self.in_flight[w] = self.pool.send(w, name, ([(s % self.per, *item) for s, item in sorted(items.items())],))

    def assign(self, w: int) -> None:
        """Worker w's idle slots take waiting episodes: each the next one of a task whose scene it has built if one
        is left (building a task takes seconds)."""
        assigned: dict[int, tuple] = {}
        for s in self.slots(w):
            if self.running[s] is None and self.queue.has_next():
                self.running[s] = self.queue.take(lambda spec, built=self.built[s]: self.scene_of(spec.task_name)
                                                  in built)
                assigned[s] = (self.running[s],)
                self.steps[s], self.rewards[s], self.frames[s] = 0, [], []
        self.send(w, "begin", assigned)

    def begun(self, w: int, answers: list) -> None:
        for j, obs, seconds, scenes in answers:
            self.build_s += seconds
            s, obs = w * self.per + j, self.shared[w].get(obs)
            spec = self.running[s]
            self.built[s] = scenes  # as the worker's env keeps them (the suite's limit applies there)
            self.policy.reset_env(s, spec.task_name, spec.key)
            self.policy.observe(s, obs)
            if spec.record:
                self.frames[s].append(video_frame(obs, self.video_keys))
            self.kept[s] = ([obs], []) if spec.keep else None
            if spec.index == 0 and spec.task_name not in self.first_frames:
                self.first_frames[spec.task_name] = video_frame(obs, self.video_keys)

    def plan(self, ws: list[int]) -> None:
        """One batched decision for every running env of these workers, then each worker's advance call: each
        env runs its whole chunk, rendering only the frames the next decision reads."""
        if self.startup_s is None:
            self.startup_s = time.perf_counter() - self.t0  # worker start-up included on a fresh runner
        active = [False] * len(self.running)
        for w in ws:
            for s in self.slots(w):
                active[s] = self.running[s] is not None
        planned = self.policy.act_chunk(active)  # the same whichever envs share the batch (ChunkingPolicy)
        self.decisions += sum(active)
        for w in ws:
            items = {s: (planned[s], self.keep, self.running[s].record or self.running[s].keep)
                     for s in self.slots(w) if active[s]}
            for s in items:
                self.chunks[s] = planned[s]
            self.send(w, "advance", items)

    def advanced(self, w: int, answers: list) -> None:
        ended = []
        for j, rendered, taken, reward, done, success in answers:
            s = w * self.per + j
            self.steps[s] += taken
            self.env_steps += taken
            self.rewards[s].append(reward)
            for t, obs in rendered:
                obs = self.shared[w].get(obs)
                # an episode cut by the time limit: its last frames are the state a critic bootstraps from
                if t >= len(self.chunks[s]) - self.keep or (done and not success):
                    self.policy.observe(s, obs)
                if self.running[s].record:
                    self.frames[s].append(video_frame(obs, self.video_keys))
                if self.kept[s] is not None:
                    self.kept[s][0].append(obs)
            if self.kept[s] is not None:
                self.kept[s][1].extend(self.chunks[s][:taken])
            if done:
                ended.append((s, success))
        if self.policy.record:
            self.policy.bootstrap([s for s, success in ended if not success])
        for s, success in ended:
            self.finish(s, success)

    def finish(self, s: int, success: bool) -> None:
        spec = self.running[s]
        episode = finished_episode(spec, success, self.steps[s], self.policy, s, self.rewards[s])
        self.episodes.append(episode)
        if spec.record and self.video_dir is not None:
            tag = "success" if success else "failure"
            write_mp4(Path(self.video_dir) / f"{spec.task_name}_ep{spec.index}_{tag}.mp4", self.frames[s])
        if self.kept[s] is not None and self.sink is not None:
            observations, actions = self.kept[s]
            # the observation before each action (the one after the last is not part of a demonstration); the
            # sink stacks them, off the driving thread if it writes there
            self.sink({**episode, "steps": {"obs": observations[:len(actions)], "actions": actions}})
        self.running[s], self.kept[s] = None, None
        if self.stop is not None:
            self.stop.finished(episode)

    def lost(self, failed_workers: list[int]) -> None:
        """Episodes whose worker died or hung: queued again from their seed, or dropped."""
        for s in [s for w in failed_workers for s in self.slots(w)]:
            self.built[s] = []  # a replaced worker starts with nothing built
            if self.running[s] is None:
                continue
            if self.rerun_failed and not self.stopping:
                self.queue.put_back(self.running[s])
                self.reruns += 1
            else:
                self.dropped += 1
                if self.stop is not None:
                    self.stop.dropped(self.running[s])
            self.abandon(s)

    def cancel(self, w: int) -> None:
        """The stop rule is satisfied: worker w's episodes end unfinished (it resets them on its next begin)."""
        for s in self.slots(w):
            if self.running[s] is not None:
                self.abandon(s)
                self.cancelled += 1

    def abandon(self, s: int) -> None:
        if self.policy.record:
            self.policy.take_record(s)
        self.running[s], self.frames[s], self.kept[s] = None, [], None

    def summary(self, restarts_before: int, busy_before: float, inference_before: float, calls_before: int
                ) -> dict[str, Any]:
        """The results, and where the wall time went: workers' share of n x wall busy in the simulator, the
        policy's share of wall, the driving process's share of wall spent waiting for workers (the rest is its own
        bookkeeping: frames, calls), how long the first episodes took to start, and the workers' seconds (and share
        of n x wall) spent building tasks."""
        seconds = time.perf_counter() - self.t0
        out = {"episodes": sorted(self.episodes, key=lambda e: (e["task"], e["seed"], e["episode"])),
               "env_steps": self.env_steps, "seconds": seconds,
               "env_steps_per_second": self.env_steps / max(seconds, 1e-9)}
        policy, pool = self.policy, self.pool
        out.update(first_frames=dict(sorted(self.first_frames.items())), reruns=self.reruns, dropped=self.dropped,
                   cancelled=self.cancelled, worker_restarts=pool.restarts - restarts_before,
                   startup_seconds=self.startup_s or 0.0, task_build_seconds=self.build_s,
                   worker_busy_share=(pool.busy_s - busy_before) / max(1e-9, self.n_workers * out["seconds"]),
                   task_build_share=self.build_s / max(1e-9, self.n_workers * out["seconds"]),
                   policy_share=(policy.inference_seconds - inference_before) / max(1e-9, out["seconds"]),
                   driver_idle_share=self.idle_s / max(1e-9, out["seconds"]),
                   decisions_per_plan=self.decisions / max(1, policy.plan_calls - calls_before),
                   pipeline_stages=-(-self.n_workers // self.per_stage),
                   **decision_counts(self.decisions, policy.plan_calls - calls_before, self.per_stage * self.per))
        return out
