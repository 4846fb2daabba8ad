"""Scripted-expert demonstrations for any suite with an episode source (MetaWorld, LIBERO).

Work is split into jobs of a few episodes (one task each) run by spawned worker processes; each job
writes a shard file, and a task's shards are merged into the task's file (``task.file_pattern``)
atomically as soon as the task's last job is done. A finished task file records the settings it was collected
with and is reused only by a run asking for the same ones; each shard records its settings too, so an
interrupted collection resumes with its finished jobs (and refuses to mix in shards made with other settings).
A suite's episode source (``Suite.expert``, looked up in ``ript.registry.EXPERTS``: ``ript.experts.metaworld``,
``ript.experts.libero.episode``) opens a task with its expert, runs one episode and names the file attributes.
"""

from __future__ import annotations

import itertools
import json
import math
import multiprocessing as mp
import os
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ript.data.hdf5 import COLLECTION_ATTR, Demo, merge_demo_files, read_file_attrs, write_demo_file
from ript.envs.compiled_scenes import CompiledScenes
from ript.envs.gl import use_render_gpu, worker_render_gpus
from ript.envs.seeds import demo_layout_seed, demo_noise_rng
from ript.envs.suites import get_suite
from ript.errors import RiptError
from ript.experts.base import EpisodeSource
from ript.registry import EXPERTS
from ript.utils.locking import holding
from ript.utils.logging import log
from ript.utils.processes import die_with_parent, process_is_running


@dataclass(frozen=True)
class Job:
    suite: str
    task: str
    first_episode: int
    num_episodes: int
    seed: int
    noise: float
    filter_success: bool
    max_attempts: int
    render: dict
    max_episode_steps: int
    shard_path: str


def _exit_with_parent(progress, started, render_gpus: list) -> None:
    """Worker initializer: keep the progress queue, take the next EGL device (``started`` counts the workers
    so far), and die with the parent (a killed ``collect`` leaves no orphaned workers behind)."""
    global _progress
    _progress = progress
    with started.get_lock():
        index = started.value
        started.value += 1
    use_render_gpu(render_gpus[index % len(render_gpus)])
    die_with_parent()


_progress = None  # the worker process's progress queue (set by _exit_with_parent in each worker)


def episode_source(name: str) -> EpisodeSource:
    """The episode source a suite names (``Suite.expert``). Importing the families' modules registers them; each
    loads its simulator only when a task is opened, so a host with one simulator installed collects its suites."""
    from ript.experts import metaworld  # noqa: F401
    from ript.experts.libero import episode  # noqa: F401

    return EXPERTS.build(name)


def job_settings(job: Job) -> dict[str, Any]:
    """What determines a job's demos; stored in its shard so a rerun reuses only shards made the same way."""
    return {k: v for k, v in asdict(job).items() if k != "shard_path"}


def work_runs(jobs: list[Job], workers: int) -> Iterator[list[Job]]:
    """The jobs in order as runs for the workers, each run asked for when a worker frees up. A worker opens a
    task once for a run's consecutive jobs of it (opening a MetaWorld task with its renderer takes ~0.8 s on the
    GPU host: with one open per job it took 22-51% of the workers' time). Each run takes 1/(2 x workers) of the
    jobs left, so runs shrink towards the end and the workers finish close together: tasks' episodes differ in
    length up to 4x (LIBERO-Goal: 77-290 steps), and runs of equal episode counts, two per worker, kept the
    workers busy 66% of the time on LIBERO-Goal's 500 demos."""
    left = list(jobs)
    while left:
        n = max(1, math.ceil(len(left) / (2 * workers)))
        run, left = left[:n], left[n:]
        yield run


def _run_jobs(jobs: list[Job], compiled: CompiledScenes | None = None) -> list[dict[str, Any]]:
    """Run a list of jobs in order, each writing its shard, keeping a task open across consecutive jobs of it;
    ``compiled``: the collection's folder of compiled scenes, shared by its workers."""
    out, task, opened = [], None, None
    try:
        for job in jobs:
            t0 = time.perf_counter()
            key = (job.suite, job.task, json.dumps(job.render, sort_keys=True), job.max_episode_steps)
            if key != opened:
                if task is not None:
                    task.close()
                    task = None  # closed: not closed again if the next task fails to open
                task = episode_source(get_suite(job.suite).expert).open_task(job.task, job.suite, job.render,
                                                                       job.max_episode_steps, compiled)
                opened = key
            out.append(_run_job(job, task, time.perf_counter() - t0))
    finally:
        if task is not None:
            task.close()
    return out


def _run_job(job: Job, task, open_s: float) -> dict[str, Any]:
    """Run one job on an open task and write its shard; returns its counts and where its seconds went."""
    source = episode_source(get_suite(job.suite).expert)
    t_open = time.perf_counter()
    demos: list[Demo] = []
    attempts = retry = steps = 0
    # Seeds depend only on (seed, task, episode index, retry), not on how work is split into jobs.
    while len(demos) < job.num_episodes and attempts < job.max_attempts:
        episode = job.first_episode + len(demos)
        layout_seed = demo_layout_seed(job.seed, episode, retry)
        noise_rng = demo_noise_rng(job.seed, job.task, episode, retry)
        demo = source.run_episode(task, layout_seed, noise_rng, job.noise)
        attempts += 1
        retry += 1
        steps += len(demo.actions)
        if demo.attrs["success"] or not job.filter_success:
            demos.append(demo)
            if _progress is not None:
                _progress.put(1)
            retry = 0
    t_run = time.perf_counter()
    write_demo_file(Path(job.shard_path), demos, {"shard": json.dumps(job_settings(job)), "attempts": attempts})
    return {"task": job.task, "demos": len(demos), "attempts": attempts, "env_steps": steps,
            "open_s": open_s, "episodes_s": t_run - t_open, "write_s": time.perf_counter() - t_run}


def _read_shard(path: Path) -> tuple[dict | None, int, int]:
    """(settings, demos, attempts) of a finished shard; settings None for a shard from before manifests."""
    try:
        with h5py.File(path, "r") as f:
            raw = f["data"].attrs.get("shard")
            settings = json.loads(raw) if isinstance(raw, str) else None
            demos = len([n for n in f["data"] if n.startswith("demo_")])
            return settings, demos, int(f["data"].attrs.get("attempts", 0))
    except (OSError, KeyError, ValueError):
        return None, 0, 0  # a damaged shard: collected again


def remove_stale_temporaries(data_dir: Path) -> None:
    """Delete the ``.<name>.<pid>.tmp`` files a killed writer left (writers still running keep theirs; a killed
    worker that nobody reaped is a zombie and writes no more)."""
    for tmp in data_dir.glob(".*.tmp"):
        pid = tmp.name[:-len(".tmp")].rsplit(".", 1)[-1]
        if pid.isdigit() and process_is_running(int(pid)):
            continue
        tmp.unlink(missing_ok=True)


def plan_jobs(jobs: list[Job], data_dir: Path, tasks: list[str]) -> tuple[list[Job], dict[str, int], dict[str, int]]:
    """Split ``jobs`` into those still to run and the demos/attempts of finished shards to reuse. A shard that
    no planned job would write the same way stops the run: mixing it in would corrupt the task's file."""
    planned = {job.shard_path: job for job in jobs}
    reused_demos: dict[str, int] = {}
    reused_attempts: dict[str, int] = {}
    done = set()
    for t in tasks:
        for shard in sorted(data_dir.glob(f".{t}.shard*.hdf5")):
            job = planned.get(str(shard))
            settings, n_demos, n_attempts = _read_shard(shard)
            if job is not None and settings == job_settings(job):
                done.add(str(shard))
                reused_demos[t] = reused_demos.get(t, 0) + n_demos
                reused_attempts[t] = reused_attempts.get(t, 0) + n_attempts
                continue
            was = "unknown settings" if settings is None else ", ".join(
                f"{k}={settings.get(k)!r}" for k in ("seed", "noise", "num_episodes", "max_attempts",
                                                      "filter_success", "max_episode_steps", "render")
                if job is None or settings.get(k) != getattr(job, k))
            raise RiptError(f"collect: {shard} is left from an interrupted run with other settings ({was}); rerun "
                            f"with those settings to resume it, or delete {data_dir}/.{t}.shard*.hdf5 to start clean")
    return [j for j in jobs if j.shard_path not in done], reused_demos, reused_attempts


@dataclass(frozen=True)
class Collection:
    """One ``collect_demos`` call's settings: what makes every job of it and every task file it writes."""

    suite: str
    data_dir: Path
    demos_per_task: int
    render: dict
    max_episode_steps: int
    seed: int
    noise: float
    filter_success: bool
    file_pattern: str

    def final(self, task: str) -> Path:
        return self.data_dir / self.file_pattern.format(name=task)

    def settings(self, task: str) -> dict[str, Any]:
        """What a task file's demos depend on, recorded in the file (``COLLECTION_ATTR``) so that a rerun reuses
        it only when it asks for the same demos."""
        return {"suite": self.suite, "task": task, "seed": self.seed, "noise": self.noise,
                "demos_per_task": self.demos_per_task, "filter_success": self.filter_success,
                "render": dict(self.render), "max_episode_steps": self.max_episode_steps}

    def reusable(self, task: str) -> bool:
        """Whether the task's file is already there, made with this run's settings; a file made otherwise stops
        the run (keeping it would leave data that does not match the request)."""
        path = self.final(task)
        if not path.exists():
            return False
        recorded = read_file_attrs(path).get(COLLECTION_ATTR)
        fix = f"collect into another folder (task.data_dir=...) or delete {path} to collect it again"
        if not isinstance(recorded, dict):
            raise RiptError(f"collect: {path} exists but records no collection settings (not written by this "
                            f"version of `ript collect`), so it cannot be checked against this run; {fix}")
        wanted = self.settings(task)
        diffs = [f"{k}={recorded.get(k)!r} (this run: {v!r})" for k, v in wanted.items() if recorded.get(k) != v]
        if diffs:
            raise RiptError(f"collect: {path} was collected with other settings ({', '.join(diffs)}); {fix}")
        return True

    def jobs(self, tasks: list[str], episodes_per_job: int) -> list[Job]:
        """Each task's demos in jobs of ``episodes_per_job``, each with its own shard file."""
        jobs = []
        for t in tasks:
            for first in range(0, self.demos_per_task, episodes_per_job):
                n = min(episodes_per_job, self.demos_per_task - first)
                # 4 attempts a demo, at least 12 retries a job: at a 64% expert a job of 2 demos falls short 2
                # times in 10^5, less often than one of 5 in its 20 (7 in 10^5), so small jobs cost no demos
                jobs.append(Job(self.suite, t, first, n, self.seed, self.noise, self.filter_success,
                                max_attempts=min(max(4 * n, n + 12), n + 90), render=dict(self.render),
                                max_episode_steps=self.max_episode_steps,
                                shard_path=str(self.data_dir / f".{t}.shard{first:05d}.hdf5")))
        return jobs

    def finish(self, source: EpisodeSource, task: str, demos: int, attempts: int, shards: list[Path]
               ) -> dict[str, Any]:
        """Merge a task's shards (this collection's own: its jobs') into its file (a task short of demos gets no
        final file, so that a rerun collects it again instead of skipping it) and return its stats."""
        attrs = {**source.file_attrs(self.suite, task, dict(self.render), self.max_episode_steps), "seed": self.seed,
                 "noise": self.noise, "filter_success": self.filter_success, "expert_attempts": attempts,
                 COLLECTION_ATTR: self.settings(task)}
        complete = demos >= self.demos_per_task
        target = self.final(task) if complete else self.data_dir / f".{task}.incomplete.hdf5"
        merged = merge_demo_files(shards, target, attrs)
        for shard in shards:
            shard.unlink()
        n_success = sum(bool(d["success"]) for d in merged)
        log.info("collect: %s: %d demos (%d successful) from %d attempts", task, len(merged), n_success, attempts)
        return {"demos": len(merged), "successes": n_success, "attempts": attempts,
                "mean_length": float(np.mean([d["num_samples"] for d in merged])) if merged else 0.0}


def collect_demos(
    suite: str,
    task_names: list[str],
    data_dir: Path,
    demos_per_task: int,
    render: dict,
    max_episode_steps: int,
    seed: int = 0,
    noise: float = 0.2,
    filter_success: bool = True,
    num_workers: int | None = None,
    episodes_per_job: int = 10,
    file_pattern: str = "{name}.hdf5",
) -> dict[str, dict[str, Any]]:
    """Collect ``demos_per_task`` demos for each task into ``<data_dir>/<file_pattern>``. Returns per-task stats.

    Each job's shard records the settings it was made with; a rerun reuses the shards made the same way and
    refuses shards made otherwise. A task's file is written as soon as its last job finishes."""
    run = Collection(suite, Path(data_dir), demos_per_task, render, max_episode_steps, seed, noise, filter_success,
                     file_pattern)
    with holding(run.data_dir, "task.data_dir"):  # one writer per data folder, checked writable before any episode
        return _collect(run, task_names, num_workers, episodes_per_job)


def require_complete(stats: dict[str, dict[str, Any]], demos_per_task: int, data_dir: Path) -> None:
    """One line naming the first task whose expert fell short of ``demos_per_task`` successful demos (its
    episodes are kept in its ``.incomplete`` file, which nothing trains on)."""
    short = [t for t, s in stats.items() if s["demos"] < demos_per_task]
    if short:
        s = stats[short[0]]
        raise RiptError(f"collect: the expert reached only {s['demos']} of {demos_per_task} successful demos "
                        f"for {short[0]!r} in {s['attempts']} attempts (kept in "
                        f"{Path(data_dir) / ('.' + short[0] + '.incomplete.hdf5')}); raise "
                        f"task.max_episode_steps or set filter_success=false")


def _collect(run: Collection, task_names: list[str], num_workers: int | None, episodes_per_job: int
             ) -> dict[str, dict[str, Any]]:
    demos_per_task = run.demos_per_task
    source = episode_source(get_suite(run.suite).expert)
    remove_stale_temporaries(run.data_dir)
    todo = [t for t in task_names if not run.reusable(t)]
    for t in sorted(set(task_names) - set(todo)):
        log.info("collect: %s exists with these settings, skipping", run.final(t))
        for shard in run.data_dir.glob(f".{t}.shard*.hdf5"):  # merged into the file before a kill could unlink them
            shard.unlink()
    planned = run.jobs(todo, episodes_per_job)
    own = {t: [Path(j.shard_path) for j in planned if j.task == t] for t in todo}
    jobs, collected, attempts = plan_jobs(planned, run.data_dir, todo)
    if collected:
        log.info("collect: resuming; %d finished demos of an interrupted run are kept", sum(collected.values()))
    remaining = {t: sum(j.task == t for j in jobs) for t in todo}
    stats: dict[str, dict[str, Any]] = {}
    for t in [t for t in todo if remaining[t] == 0]:  # every shard of the task was already there
        stats[t] = run.finish(source, t, collected.get(t, 0), attempts.get(t, 0), own[t])
    if not jobs:
        return stats
    num_workers = max(1, min(num_workers or os.cpu_count() or 1, len(jobs)))
    spent = dict.fromkeys(("env_steps", "open_s", "episodes_s", "write_s", "merge_s"), 0.0)
    t0 = time.perf_counter()
    # LIBERO: the workers share the scenes they compile (a worker opens a task once per run of its jobs)
    compiled = CompiledScenes.create() if get_suite(run.suite).compiles_scenes else None
    try:
        for done in _run_pool(jobs, num_workers, run.data_dir, len(todo) * demos_per_task, sum(collected.values()),
                              compiled):
            task = done["task"]
            attempts[task] = attempts.get(task, 0) + done["attempts"]
            collected[task] = collected.get(task, 0) + done["demos"]
            for k in ("env_steps", "open_s", "episodes_s", "write_s"):
                spent[k] += done[k]
            remaining[task] -= 1
            if remaining[task] == 0:
                t = time.perf_counter()
                stats[task] = run.finish(source, task, collected.get(task, 0), attempts.get(task, 0), own[task])
                spent["merge_s"] += time.perf_counter() - t
    finally:
        if compiled is not None:
            compiled.remove()
    _log_time_spent(spent, time.perf_counter() - t0, num_workers)
    return stats


def _run_pool(jobs: list[Job], num_workers: int, data_dir: Path, total: int, initial: int,
              compiled: CompiledScenes | None = None):
    """Run the jobs on ``num_workers`` spawned workers, yielding each job's result as its run finishes (a progress
    bar of ``total`` demos counts the finished ones as they come)."""
    from tqdm import tqdm

    # spawn: a forked child inherits a GL context and hangs.
    ctx = mp.get_context("spawn")
    progress = ctx.Queue()
    bar = tqdm(total=total, initial=initial, desc="collect", unit="demo")
    with ProcessPoolExecutor(num_workers, mp_context=ctx, initializer=_exit_with_parent,
                             initargs=(progress, ctx.Value("i", 0), worker_render_gpus(num_workers))) as pool:
        runs = work_runs(jobs, num_workers)
        pending = {pool.submit(_run_jobs, run, compiled) for run in itertools.islice(runs, num_workers)}
        try:
            while pending:
                finished, _ = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                while not progress.empty():
                    bar.update(progress.get())
                for future in finished:
                    pending.discard(future)
                    run = next(runs, None)  # the freed worker's, sized by what is left now
                    if run is not None:
                        pending.add(pool.submit(_run_jobs, run, compiled))
                    yield from future.result()  # re-raises a worker's error here
        except BrokenProcessPool:
            raise RiptError(f"collect: a worker process died (killed, or out of memory) while collecting into "
                            f"{data_dir}; finished jobs are kept: rerun the same command to resume") from None
        finally:
            for future in pending:
                future.cancel()
            bar.close()


def _log_time_spent(spent: dict[str, float], wall: float, num_workers: int) -> None:
    busy = max(1e-9, spent["open_s"] + spent["episodes_s"] + spent["write_s"])
    log.info("collect: %d env steps in %.1f s (%.0f steps/s, %d workers); workers' time: opening tasks %.0f%%, "
             "episodes %.0f%%, writing shards %.0f%%, busy %.0f%% of workers x wall; merging task files %.1f s",
             spent["env_steps"], wall, spent["env_steps"] / max(wall, 1e-9), num_workers,
             100 * spent["open_s"] / busy, 100 * spent["episodes_s"] / busy, 100 * spent["write_s"] / busy,
             100 * busy / (num_workers * wall), spent["merge_s"])
