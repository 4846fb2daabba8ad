"""Scripted-expert demonstrations for any suite with an episode source (MetaWorld, LIBERO).

Work is split into jobs of a few episodes (one task each) run by spawned worker processes; each job
writes a shard file, and a task's shards are merged into the task's file (``task.file_pattern``)
atomically. A finished task file is skipped, so an interrupted collection resumes where it stopped.
A suite's episode source (``collect_metaworld``, ``collect_libero``) opens a task with its expert, runs
one episode and names the file attributes.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ript.data.hdf5 import Demo, merge_demo_files, write_demo_file
from ript.utils.logging import log

TRAIN_SEED_STRIDE = 100_000  # layout seeds of demo j: seed * stride + j; evaluation uses a disjoint range


def episode_source(suite: str):
    """The module that knows how to run one expert episode of ``suite``."""
    if suite == "metaworld":
        from ript.data import collect_metaworld as source
    else:
        from ript.data import collect_libero as source
        from ript.envs.libero import check_suite

        check_suite(suite)
    return source


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


def _run_job(job: Job, progress) -> tuple[str, int, int]:
    source = episode_source(job.suite)
    task = source.open_task(job.task, job.suite, job.render, job.max_episode_steps)
    demos: list[Demo] = []
    attempts = retry = 0
    try:
        # Seeds depend only on (seed, task, episode index, retry), not on how work is split into jobs.
        while len(demos) < job.num_episodes and attempts < job.max_attempts:
            episode = job.first_episode + len(demos)
            layout_seed = job.seed * TRAIN_SEED_STRIDE + episode * 100 + retry
            noise_rng = np.random.default_rng([job.seed, zlib.crc32(job.task.encode()), episode, retry])
            demo = source.run_episode(task, layout_seed, noise_rng, job.noise)
            attempts += 1
            retry += 1
            if demo.attrs["success"] or not job.filter_success:
                demos.append(demo)
                progress.put(1)
                retry = 0
    finally:
        task.close()
    write_demo_file(Path(job.shard_path), demos, {"shard": True})
    return job.task, len(demos), attempts


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
    """Collect ``demos_per_task`` demos for each task into ``<data_dir>/<file_pattern>``. Returns per-task stats."""
    from tqdm import tqdm

    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    source = episode_source(suite)

    def final(t: str) -> Path:
        return data_dir / file_pattern.format(name=t)

    todo = [t for t in task_names if not final(t).exists()]
    for t in sorted(set(task_names) - set(todo)):
        log.info("collect: %s exists, skipping", final(t))
    jobs = []
    for t in todo:
        for first in range(0, demos_per_task, episodes_per_job):
            n = min(episodes_per_job, demos_per_task - first)
            jobs.append(
                Job(suite, t, first, n, seed, noise, filter_success, max_attempts=min(4 * n, n + 90), render=dict(render),
                    max_episode_steps=max_episode_steps,
                    shard_path=str(data_dir / f".{t}.shard{first:05d}.hdf5"))
            )
    stats: dict[str, dict[str, Any]] = {}
    if not jobs:
        return stats
    num_workers = max(1, min(num_workers or os.cpu_count() or 1, len(jobs)))
    attempts: dict[str, int] = {}
    collected: dict[str, int] = {}
    # spawn: a forked child inherits a GL context and hangs.
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager, ctx.Pool(num_workers) as pool:
        progress = manager.Queue()
        pending = [pool.apply_async(_run_job, (job, progress)) for job in jobs]
        bar = tqdm(total=len(todo) * demos_per_task, desc="collect", unit="demo")
        remaining = list(pending)
        while remaining:
            try:
                bar.update(progress.get(timeout=0.5))
            except Exception:  # queue.Empty through the manager proxy
                pass
            still = []
            for r in remaining:
                if r.ready():
                    task, n_demos, n_attempts = r.get()  # re-raises a worker's error here
                    attempts[task] = attempts.get(task, 0) + n_attempts
                    collected[task] = collected.get(task, 0) + n_demos
                else:
                    still.append(r)
            remaining = still
        while not progress.empty():
            bar.update(progress.get())
        bar.close()
    for t in todo:
        shards = sorted(data_dir.glob(f".{t}.shard*.hdf5"))
        attrs = {
            **source.file_attrs(suite, t, dict(render), max_episode_steps),
            "seed": seed,
            "noise": noise,
            "filter_success": filter_success,
            "expert_attempts": attempts[t],
        }
        # a task short of demos gets no final file, so that a rerun collects it again instead of skipping it
        complete = collected.get(t, 0) >= demos_per_task
        target = final(t) if complete else data_dir / f".{t}.incomplete.hdf5"
        demos = merge_demo_files(shards, target, attrs)
        for shard in shards:
            shard.unlink()
        n_success = sum(bool(d["success"]) for d in demos)
        stats[t] = {"demos": len(demos), "successes": n_success, "attempts": attempts[t],
                    "mean_length": float(np.mean([d["num_samples"] for d in demos])) if demos else 0.0}
        log.info("collect: %s: %d demos (%d successful) from %d attempts", t, len(demos), n_success, attempts[t])
    return stats

