"""Env runner: evaluates a policy on episodes of one or more tasks in parallel worker processes.

Workers are replaceable processes (``envs/workers.py``), each hosting ``envs_per_worker`` env slots
(``envs/worker_env.py``) and driven through two calls: ``begin`` (start episodes: task, seed) and ``advance``
(each env's whole chunk of actions; images only for the frames the next decision reads, through shared
memory). Each worker runs on its own: as soon as it answers it gets its next call (episodes started, or its
envs' next chunks, planned in one batched call with every other worker that answered meanwhile), so a slow
reset or a task being built holds up no other worker. A slot keeps its simulator tasks built and takes the next
episode of its own task while one is left. Each episode samples from its own noise stream, so neither the
schedule nor the batch nor the slot an episode lands in changes it. A worker that dies
or hangs is replaced; its episodes are run again from their seeds (``on_worker_failure="rerun"``,
evaluation) or dropped (``"drop"``, RL), and the results count both.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from ript.envs.seeds import eval_layout_seed
from ript.envs.worker_env import EpisodeSpec, WorkerSet
from ript.envs.workers import Pending
from ript.policies.base import ChunkingPolicy
from ript.utils.atomic import atomic_write_text
from ript.utils.processes import driver_threads
from ript.utils.video import write_mp4


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


def default_num_workers(requested: int | str | None, n_episodes: int, envs_per_worker: int = 1) -> int:
    if requested in (None, "auto"):
        requested = os.cpu_count() or 1
    return max(1, min(int(requested), -(-n_episodes // envs_per_worker)))


def _video_frame(obs: dict[str, np.ndarray], keys: list[str]) -> np.ndarray:
    return np.concatenate([obs[k] for k in keys], axis=1)


class EnvRunner:
    def __init__(
        self,
        suite: str,
        task_names: list[str],
        render: dict,
        max_episode_steps: int,
        episodes_per_task: int,
        num_workers: int | str | None = "auto",
        seed: int = 0,
        n_videos: int = 0,
        worker_timeout_s: float = 600.0,
        max_worker_restarts: int = 3,
        on_worker_failure: str = "rerun",
        envs_per_worker: int = 1,
        episodes_at_once: int | None = None,
        driver_threads: int | None = None,
    ):
        self.suite = suite
        self.task_names = list(task_names)
        self.render = dict(render)
        self.max_episode_steps = max_episode_steps
        self.episodes_per_task = episodes_per_task
        self.envs_per_worker = int(envs_per_worker)
        if self.envs_per_worker < 1:
            raise ValueError(f"envs_per_worker={envs_per_worker!r}: expected 1 or more")
        # no more workers than a run can use: the protocol's episodes, or what the caller runs at once (RL's rounds)
        at_once = episodes_per_task * len(task_names) if episodes_at_once is None else int(episodes_at_once)
        self.num_workers = default_num_workers(num_workers, at_once, self.envs_per_worker)
        self.seed = seed
        self.n_videos = n_videos
        if on_worker_failure not in ("rerun", "drop"):
            raise ValueError(f"on_worker_failure={on_worker_failure!r}: expected 'rerun' or 'drop'")
        self.worker_timeout_s, self.max_worker_restarts = worker_timeout_s, max_worker_restarts
        self.rerun_failed = on_worker_failure == "rerun"
        # torch threads of this (driving) process while the workers run; None: the cores they leave, at least one
        self.driver_threads = driver_threads
        self.workers: WorkerSet | None = None
        self.slot_tasks: list[list[str]] = []  # set with the workers

    def specs(self) -> list[EpisodeSpec]:
        out = []
        for j in range(self.episodes_per_task):  # interleave tasks so workers share the slow ones
            for t in self.task_names:
                out.append(EpisodeSpec(t, eval_layout_seed(self.seed, j), j, j < self.n_videos))
        return out

    def _ensure_workers(self, frames_per_env: int) -> WorkerSet:
        if self.workers is None:
            self.workers = WorkerSet(self.suite, self.render, self.max_episode_steps, self.num_workers,
                                     self.envs_per_worker, frames_per_env, self.worker_timeout_s,
                                     self.max_worker_restarts)
            # the tasks each env slot has built, as its worker last reported (kept across runs, as the workers are)
            self.slot_tasks = [[] for _ in range(self.num_workers * self.envs_per_worker)]
        return self.workers

    @property
    def env_slots(self) -> int:
        return self.num_workers * self.envs_per_worker

    def run(self, policy: ChunkingPolicy, video_dir: Path | None = None, specs: list[EpisodeSpec] | None = None,
            stop: StopRule | None = None) -> dict[str, Any]:
        """Run every episode of ``specs`` (default: the evaluation protocol), or until ``stop`` is satisfied
        (the rest are then cancelled and counted). With a recording policy, each episode dict also carries its
        ``decisions``."""
        workers = self._ensure_workers(policy.frame_stack)
        with driver_threads(len(workers.pool), self.driver_threads):
            return self._run(policy, workers, video_dir, specs, stop)

    def _run(self, policy: ChunkingPolicy, workers: WorkerSet, video_dir: Path | None, specs: list[EpisodeSpec] | None,
             stop: StopRule | None) -> dict[str, Any]:
        keep = policy.frame_stack
        pool, shared, per = workers.pool, workers.frames, workers.envs_per_worker
        n_workers = len(pool)
        n = n_workers * per  # env slots; slot s is env s % per of worker s // per
        specs = self.specs() if specs is None else list(specs)
        n_specs = len(specs)
        pending = list(specs)
        pending.reverse()  # popped from the end
        built = self.slot_tasks
        running: list[EpisodeSpec | None] = [None] * n
        steps = [0] * n
        chunks: list = [None] * n
        rewards: list[list[float]] = [[] for _ in range(n)]  # each decision's chunk reward (the suite's own)
        frames: list[list] = [[] for _ in range(n)]
        episodes: list[dict] = []
        first_frames: dict[str, np.ndarray] = {}  # task -> the cameras' first view of its episode 0 (a picture)
        policy.reset(n)
        video_keys = [f"{c}_rgb" for c in self.render["cameras"]]
        t0 = time.perf_counter()
        env_steps = reruns = dropped = cancelled = 0
        build_s, startup_s = 0.0, None
        stopping = False
        restarts_before, busy_before, inference_before = pool.restarts, pool.busy_s, policy.inference_seconds
        calls_before, decisions = policy.plan_calls, 0
        in_flight: dict[int, Pending] = {}  # worker -> its call not yet answered (at most one each)

        def slots(w: int) -> range:
            return range(w * per, (w + 1) * per)

        def send(w: int, name: str, items: dict[int, tuple]) -> None:
            """One call to worker w: its list of (env, *item) for the slots in ``items``."""
            in_flight[w] = pool.send(w, name, ([(s % per, *item) for s, item in sorted(items.items())],))

        def begin(w: int) -> None:
            assigned: dict[int, tuple] = {}
            for s in slots(w):
                if running[s] is None and pending:
                    # the next episode of a task the slot has built if one is left (building one takes seconds)
                    j = next((j for j in range(len(pending) - 1, -1, -1) if pending[j].task_name in built[s]),
                             len(pending) - 1)
                    running[s] = pending.pop(j)
                    assigned[s] = (running[s],)
                    steps[s], rewards[s], frames[s] = 0, [], []
            send(w, "begin", assigned)

        def begun(w: int, answers: list) -> None:
            nonlocal build_s
            for j, obs, seconds, tasks in answers:
                build_s += seconds
                s, obs = w * per + j, shared[w].get(obs)
                built[s] = tasks  # as the worker's env keeps them (the suite's limit applies there)
                policy.reset_env(s, running[s].task_name, running[s].key)
                policy.observe(s, obs)
                if running[s].record:
                    frames[s].append(_video_frame(obs, video_keys))
                if running[s].index == 0 and running[s].task_name not in first_frames:
                    first_frames[running[s].task_name] = _video_frame(obs, video_keys)

        def advanced(w: int, answers: list) -> None:
            nonlocal env_steps
            ended = []
            for j, rendered, taken, reward, done, success in answers:
                s = w * per + j
                steps[s] += taken
                env_steps += taken
                rewards[s].append(reward)
                for t, obs in rendered:
                    obs = shared[w].get(obs)
                    # an episode cut by the time limit: its last frames are the state a critic bootstraps from
                    if t >= len(chunks[s]) - keep or (done and not success):
                        policy.observe(s, obs)
                    if running[s].record:
                        frames[s].append(_video_frame(obs, video_keys))
                if done:
                    ended.append((s, success))
            if policy.record:
                policy.bootstrap([s for s, success in ended if not success])
            for s, success in ended:
                finish(s, success)

        def lost(failed_workers: list[int]) -> None:
            """Episodes whose worker died or hung: queued again from their seed, or dropped."""
            nonlocal reruns, dropped
            for s in [s for w in failed_workers for s in slots(w)]:
                built[s] = []  # a replaced worker starts with nothing built
                if running[s] is None:
                    continue
                if self.rerun_failed and not stopping:
                    pending.append(running[s])  # popped next
                    reruns += 1
                else:
                    dropped += 1
                    if stop is not None:
                        stop.dropped(running[s])
                if policy.record:
                    policy.take_record(s)
                running[s], frames[s] = None, []

        def finish(s: int, success: bool) -> None:
            spec = running[s]
            episodes.append({"task": spec.task_name, "episode": spec.index, "seed": spec.seed,
                             "success": bool(success), "length": steps[s]})
            if policy.record:
                episodes[-1]["decisions"] = policy.take_record(s)
                episodes[-1]["chunk_rewards"] = rewards[s]
            if spec.record and video_dir is not None:
                tag = "success" if success else "failure"
                write_mp4(Path(video_dir) / f"{spec.task_name}_ep{spec.index}_{tag}.mp4", frames[s])
            running[s] = None
            if stop is not None:
                stop.finished(episodes[-1])

        def cancel(w: int) -> None:
            """The stop rule is satisfied: worker w's episodes end unfinished (it resets them on its next begin)."""
            nonlocal cancelled
            for s in slots(w):
                if running[s] is not None:
                    if policy.record:
                        policy.take_record(s)
                    running[s], frames[s] = None, []
                    cancelled += 1

        def next_call(w: int, to_plan: list[int]) -> None:
            """Worker w has answered: start episodes on its idle slots, or plan its running ones' next chunks."""
            if stopping:
                cancel(w)
            elif pending and any(running[s] is None for s in slots(w)):
                begin(w)
            elif any(running[s] is not None for s in slots(w)):
                to_plan.append(w)

        def plan(ws: list[int]) -> None:
            """One batched decision for every running env of these workers, then each worker's advance call:
            each env runs its whole chunk, rendering only the frames the next decision reads."""
            nonlocal startup_s, decisions
            if not ws:
                return
            if startup_s is None:
                startup_s = time.perf_counter() - t0  # worker start-up included on a fresh runner
            active = [False] * n
            for w in ws:
                for s in slots(w):
                    active[s] = running[s] is not None
            planned = policy.act_chunk(active)  # the same whichever envs share the batch (ChunkingPolicy)
            decisions += sum(active)
            for w in ws:
                items = {s: (planned[s], keep, running[s].record) for s in slots(w) if active[s]}
                for s in items:
                    chunks[s] = planned[s]
                send(w, "advance", items)

        # Each worker runs on its own: when one answers, it gets its next call at once (episodes started, or a
        # chunk planned together with whoever else has answered meanwhile), so a slow reset or a task being
        # built holds up only its own worker. Episodes sample from their own noise streams and a stop rule
        # decides from which episodes ended, so the schedule changes no result.
        to_plan: list[int] = []
        for w in range(n_workers):
            next_call(w, to_plan)
        plan(to_plan)
        while in_flight:
            to_plan = []
            for w in pool.ready(in_flight):
                call = in_flight.pop(w)
                results, failed = pool.receive(call)
                lost(failed)
                if results[w] is not None:
                    (begun if call.name == "begin" else advanced)(w, results[w])
                if stop is not None and not stopping and stop.satisfied():
                    stopping = True
                    cancelled += len(pending)
                    pending.clear()
                    for other in range(n_workers):
                        if other not in in_flight and other != w:
                            cancel(other)  # workers with a call in flight are cancelled when they answer
                    to_plan = []
                next_call(w, to_plan)
            plan(to_plan)
        if len(episodes) + dropped + cancelled != n_specs:
            raise RuntimeError(f"runner finished {len(episodes)} episodes of {n_specs} ({dropped} dropped, "
                               f"{cancelled} cancelled)")
        out = summarize(episodes, time.perf_counter() - t0, env_steps)
        # where the wall time went: workers' share of n x wall busy in the simulator, the policy's share of wall
        # and how long the first episodes took to start, and the workers' seconds spent building tasks
        out.update(first_frames=dict(sorted(first_frames.items())), reruns=reruns, dropped=dropped,
                   cancelled=cancelled, worker_restarts=pool.restarts - restarts_before,
                   startup_seconds=startup_s or 0.0, task_build_seconds=build_s,
                   worker_busy_share=(pool.busy_s - busy_before) / max(1e-9, n_workers * out["seconds"]),
                   policy_share=(policy.inference_seconds - inference_before) / max(1e-9, out["seconds"]),
                   decisions_per_plan=decisions / max(1, policy.plan_calls - calls_before))
        return out

    def close(self) -> None:
        if self.workers is not None:
            self.workers.close()
            self.workers = None


def summarize(episodes: list[dict], seconds: float, env_steps: int) -> dict[str, Any]:
    per_task: dict[str, dict[str, Any]] = {}
    for e in episodes:
        t = per_task.setdefault(e["task"], {"episodes": 0, "successes": 0, "lengths": []})
        t["episodes"] += 1
        t["successes"] += int(e["success"])
        t["lengths"].append(e["length"])
    for t in per_task.values():
        t["success_rate"] = t["successes"] / t["episodes"]
        t["mean_length"] = float(np.mean(t.pop("lengths")))
    rates = [t["success_rate"] for t in per_task.values()]
    return {
        "success_rate": float(np.mean(rates)) if rates else 0.0,
        "per_task": dict(sorted(per_task.items())),
        "episodes": sorted(episodes, key=lambda e: (e["task"], e["seed"], e["episode"])),
        "env_steps": env_steps,
        "seconds": seconds,
        "env_steps_per_second": env_steps / max(seconds, 1e-9),
    }


def success_table(results: dict[str, Any]) -> str:
    rows = [f"{'task':<32} {'success':>8} {'episodes':>9} {'mean len':>9}"]
    for name, t in results["per_task"].items():
        rows.append(f"{name:<32} {t['success_rate']:>8.1%} {t['episodes']:>9d} {t['mean_length']:>9.1f}")
    rows.append(f"{'average':<32} {results['success_rate']:>8.1%}")
    return "\n".join(rows)


def write_results(path: Path, results: dict[str, Any]) -> None:
    """The results as JSON, less the first frames (pictures, written as ``first_frames.png``)."""
    atomic_write_text(Path(path), json.dumps({k: v for k, v in results.items() if k != "first_frames"}, indent=2))
