"""Env runner: evaluates a policy on episodes of one or more tasks in parallel worker processes.

Workers are replaceable processes (``envs/workers.py``). Each worker hosts one simulator task at a time and
is driven through two methods: ``begin`` (start an episode: task, seed) and ``advance_chunk`` (the policy's
whole chunk of actions, images only for the frames the next decision reads). The workers form ``groups``
that take turns: while one group simulates its chunks, the policy plans, in one batched call, for the next
group (``groups=1``: lock-step, one call for every env). Each episode samples from its own noise stream, so
the grouping changes the speed, not the episodes. A
worker that dies or hangs is replaced; its episode is run again from its seed (``on_worker_failure="rerun"``,
evaluation) or dropped (``"drop"``, RL), and the results count both.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ript.envs.seeds import eval_layout_seed
from ript.envs.suites import get_suite
from ript.envs.workers import WorkerPool
from ript.policies.base import ChunkingPolicy
from ript.utils.checkpoint import atomic_write_text
from ript.utils.video import write_mp4

@dataclass(frozen=True)
class EpisodeSpec:
    task_name: str
    seed: int
    index: int  # episode number within its task (RL: within the round, so K rollouts of one layout differ)
    record: bool = False

    @property
    def key(self) -> int:
        """A stable 63-bit name of the episode, which seeds its policy-noise stream (``policies/base.py``)."""
        digest = hashlib.blake2b(f"{self.task_name}|{self.seed}|{self.index}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") >> 1


class TaskWorkerEnv:
    """A worker's env: builds simulator tasks on demand and keeps them for reuse."""

    def __init__(self, suite: str, render: dict, max_episode_steps: int):
        self.render_cfg, self.max_steps = render, max_episode_steps
        self.tasks: dict[str, Any] = {}  # in order of last use
        self.current = None
        self.suite_entry = get_suite(suite)
        self.cache_limit = self.suite_entry.tasks_per_worker  # a LIBERO scene holds ~0.8 GB

    def begin(self, spec: EpisodeSpec):
        task = self.tasks.pop(spec.task_name, None)
        if task is None:
            while self.cache_limit is not None and len(self.tasks) >= self.cache_limit:
                self.tasks.pop(next(iter(self.tasks))).close()  # least recently used
            task = self.suite_entry.make_task(spec.task_name, self.render_cfg, self.max_steps)
        self.tasks[spec.task_name] = self.current = task
        return self.current.reset(spec.seed, render=True)

    def advance_chunk(self, chunk: np.ndarray, keep_last: int, record: bool):
        """Run this worker's whole action chunk (stopping at the episode's end) in one call. Renders only the
        last ``keep_last`` steps (the policy's next frame stack), or every step of a recorded episode;
        returns ([(step, obs), ...] rendered, steps taken, done, success)."""
        rendered, done, success, n = [], False, False, len(chunk)
        for t, action in enumerate(chunk):
            render = record or t >= n - keep_last
            obs, _, done, info = self.current.step(action, render=render)
            success = info["success"]
            if render:
                rendered.append((t, obs))
            if done:
                break
        return rendered, t + 1, done, success

    def close(self):
        for task in self.tasks.values():
            task.close()
        self.tasks.clear()


def make_workers(suite: str, render: dict, max_episode_steps: int, num_workers: int, timeout_s: float,
                 max_restarts: int) -> WorkerPool:
    fn = functools.partial(TaskWorkerEnv, suite, render, max_episode_steps)
    return WorkerPool([fn] * num_workers, timeout_s, max_restarts)


def default_num_workers(requested: int | str | None, n_episodes: int) -> int:
    if requested in (None, "auto"):
        requested = os.cpu_count() or 1
    return max(1, min(int(requested), n_episodes))


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
        groups: int | str = 1,
    ):
        self.suite = suite
        self.task_names = list(task_names)
        self.render = dict(render)
        self.max_episode_steps = max_episode_steps
        self.episodes_per_task = episodes_per_task
        self.num_workers = default_num_workers(num_workers, episodes_per_task * len(task_names))
        self.seed = seed
        self.n_videos = n_videos
        if on_worker_failure not in ("rerun", "drop"):
            raise ValueError(f"on_worker_failure={on_worker_failure!r}: expected 'rerun' or 'drop'")
        self.worker_timeout_s, self.max_worker_restarts = worker_timeout_s, max_worker_restarts
        self.rerun_failed = on_worker_failure == "rerun"
        self.groups = groups  # "auto": 2 when the policy runs on a GPU and there are 4+ workers, else 1
        self.envs: WorkerPool | None = None

    def specs(self) -> list[EpisodeSpec]:
        out = []
        for j in range(self.episodes_per_task):  # interleave tasks so workers share the slow ones
            for t in self.task_names:
                out.append(EpisodeSpec(t, eval_layout_seed(self.seed, j), j, j < self.n_videos))
        return out

    def _ensure_envs(self):
        if self.envs is None:
            self.envs = make_workers(self.suite, self.render, self.max_episode_steps, self.num_workers,
                                     self.worker_timeout_s, self.max_worker_restarts)
        return self.envs

    def run(self, policy: ChunkingPolicy, video_dir: Path | None = None, specs: list[EpisodeSpec] | None = None) -> dict[str, Any]:
        """Run every episode of ``specs`` (default: the evaluation protocol). With a recording policy, each
        episode dict also carries its ``decisions``."""
        envs = self._ensure_envs()
        n = self.num_workers
        specs = self.specs() if specs is None else list(specs)
        n_specs = len(specs)
        pending = list(specs)
        pending.reverse()  # popped from the end
        sticky = get_suite(self.suite).tasks_per_worker is not None
        hosted: list[str | None] = [None] * n  # the task each worker last ran
        running: list[EpisodeSpec | None] = [None] * n
        steps = [0] * n
        frames: list[list] = [[] for _ in range(n)]
        episodes: list[dict] = []
        policy.reset(n)
        video_keys = [f"{c}_rgb" for c in self.render["cameras"]]
        t0 = time.perf_counter()
        env_steps = reruns = dropped = 0
        restarts_before, busy_before, inference_before = envs.restarts, envs.busy_s, policy.inference_seconds

        def start(slots: list[int]) -> None:
            assigned: list[EpisodeSpec | None] = [None] * n
            for i in slots:
                if pending:
                    # a worker that keeps few tasks built gets the next episode of its own task if one is left
                    j = next((j for j in range(len(pending) - 1, -1, -1) if pending[j].task_name == hosted[i]),
                             len(pending) - 1) if sticky else len(pending) - 1
                    assigned[i] = running[i] = pending.pop(j)
                    hosted[i] = assigned[i].task_name
                    steps[i] = 0
                    frames[i] = []
            results, failed = envs.call("begin", [None if s is None else (s,) for s in assigned])
            lost(failed)
            for i, obs in enumerate(results):
                if obs is not None:
                    policy.reset_env(i, assigned[i].task_name, assigned[i].key)
                    policy.observe(i, obs)
                    if assigned[i].record:
                        frames[i].append(_video_frame(obs, video_keys))

        def lost(failed: list[int]) -> None:
            """Episodes whose worker died or hung: queued again from their seed, or dropped."""
            nonlocal reruns, dropped
            for i in failed:
                if running[i] is None:
                    continue
                if self.rerun_failed:
                    pending.append(running[i])  # popped next
                    reruns += 1
                else:
                    dropped += 1
                if policy.record:
                    policy.take_record(i)
                running[i], hosted[i], frames[i] = None, None, []

        def finish(i: int, success: bool) -> None:
            spec = running[i]
            episodes.append({"task": spec.task_name, "episode": spec.index, "seed": spec.seed,
                             "success": bool(success), "length": steps[i]})
            if policy.record:
                episodes[-1]["decisions"] = policy.take_record(i)
            if spec.record and video_dir is not None:
                tag = "success" if success else "failure"
                write_mp4(Path(video_dir) / f"{spec.task_name}_ep{spec.index}_{tag}.mp4", frames[i])
            running[i] = None

        keep = policy.frame_stack
        # on a CPU the policy competes with the workers for the same cores: taking turns only costs calls there
        turns = (2 if policy.device.type == "cuda" and n >= 4 else 1) if self.groups == "auto" else int(self.groups)
        turns = max(1, min(turns, n))
        members = [list(range(g, n, turns)) for g in range(turns)]
        in_flight: list = [None] * turns  # each group's advance_chunk calls, sent and not yet received
        chunks: list = [None] * n

        def receive(g: int) -> None:
            nonlocal env_steps
            results, failed = envs.receive(in_flight[g])
            in_flight[g] = None
            lost(failed)
            for i, res in enumerate(results):
                if res is None:
                    continue
                rendered, taken, done, success = res
                steps[i] += taken
                env_steps += taken
                for t, obs in rendered:
                    if t >= len(chunks[i]) - keep:
                        policy.observe(i, obs)
                    if running[i].record:
                        frames[i].append(_video_frame(obs, video_keys))
                if done:
                    finish(i, success)

        while any(s is not None for s in running) or pending or any(f is not None for f in in_flight):
            for g, group in enumerate(members):
                if in_flight[g] is not None:
                    receive(g)
                # every turn is a decision round for the group: episodes started now plan in its batched call
                idle = [i for i in group if running[i] is None]
                if idle and pending:
                    start(idle)
                active = [running[i] is not None and i % turns == g for i in range(n)]
                if not any(active):  # done, or every worker starting an episode was replaced: next turn
                    continue
                # one worker call per decision: each env runs its whole chunk, rendering only what is read; the
                # other groups' workers simulate meanwhile
                planned = policy.act_chunk(active)
                for i in group:
                    chunks[i] = planned[i]
                in_flight[g] = envs.send("advance_chunk", [
                    (planned[i], keep, running[i].record) if a else None for i, a in enumerate(active)])
        if len(episodes) + dropped != n_specs:
            raise RuntimeError(f"runner finished {len(episodes)} episodes of {n_specs} ({dropped} dropped)")
        out = summarize(episodes, time.perf_counter() - t0, env_steps)
        # where the wall time went: workers' share of n x wall busy in the simulator, the policy's share of wall
        out.update(reruns=reruns, dropped=dropped, worker_restarts=envs.restarts - restarts_before,
                   worker_busy_share=(envs.busy_s - busy_before) / max(1e-9, n * out["seconds"]),
                   policy_share=(policy.inference_seconds - inference_before) / max(1e-9, out["seconds"]))
        return out

    def close(self) -> None:
        if self.envs is not None:
            self.envs.close()
            self.envs = None


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
    atomic_write_text(Path(path), json.dumps(results, indent=2))
