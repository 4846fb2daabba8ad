"""Scripted MetaWorld demonstrations: ``metaworld.policies`` experts with Gaussian action noise.

Work is split into jobs of a few episodes (one task each) run by spawned worker processes; each job
writes a shard file, and a task's shards are merged into ``<data_dir>/<task>.hdf5`` atomically. A
finished task file is skipped, so an interrupted collection resumes where it stopped.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ript.data.hdf5 import Demo, merge_demo_files, write_demo_file
from ript.envs.metaworld import INSTRUCTIONS, MetaWorldTask, RenderSettings, expert_policy
from ript.utils.logging import log

TRAIN_SEED_STRIDE = 100_000  # layout seeds of demo j: seed * stride + j; evaluation uses a disjoint range


@dataclass(frozen=True)
class Job:
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


def run_episode(task: MetaWorldTask, policy, layout_seed: int, noise_rng: np.random.Generator, noise: float) -> Demo:
    obs = task.reset(layout_seed)
    frames: dict[str, list] = {k: [] for k in obs}
    actions, rewards, states = [], [], []
    while not task.done:
        for k, v in obs.items():
            frames[k].append(v)
        states.append(task.sim_state())
        action = policy.get_action(obs["env_state"].astype(np.float64))
        action = np.clip(action + noise_rng.normal(0.0, noise, size=action.shape), -1.0, 1.0).astype(np.float32)
        obs, reward, _, _ = task.step(action)
        actions.append(action)
        rewards.append(reward)
    dones = np.zeros(len(actions), dtype=np.uint8)
    dones[-1] = 1
    return Demo(
        actions=np.stack(actions),
        obs={k: np.stack(v) for k, v in frames.items()},
        states=np.stack(states),
        rewards=np.asarray(rewards, dtype=np.float32),
        dones=dones,
        attrs={"success": bool(task.success), "layout_seed": layout_seed},
    )


def _run_job(job: Job, progress) -> tuple[str, int, int]:
    # MetaWorld's experts warn on every call that their gains saturate; the env clips actions anyway.
    warnings.filterwarnings("ignore", message=r"Constant\(s\) may be too high")
    task = MetaWorldTask(job.task, RenderSettings.from_dict(job.render), job.max_episode_steps)
    policy = expert_policy(job.task)
    demos: list[Demo] = []
    attempts = retry = 0
    try:
        # Seeds depend only on (seed, task, episode index, retry), not on how work is split into jobs.
        while len(demos) < job.num_episodes and attempts < job.max_attempts:
            episode = job.first_episode + len(demos)
            layout_seed = job.seed * TRAIN_SEED_STRIDE + episode * 100 + retry
            noise_rng = np.random.default_rng([job.seed, zlib.crc32(job.task.encode()), episode, retry])
            demo = run_episode(task, policy, layout_seed, noise_rng, job.noise)
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


def collect_metaworld(
    task_names: list[str],
    data_dir: Path,
    demos_per_task: int,
    render: RenderSettings,
    max_episode_steps: int,
    seed: int = 0,
    noise: float = 0.2,
    filter_success: bool = True,
    num_workers: int | None = None,
    episodes_per_job: int = 10,
) -> dict[str, dict[str, Any]]:
    """Collect ``demos_per_task`` demos for each task into ``<data_dir>/<task>.hdf5``. Returns per-task stats."""
    from tqdm import tqdm

    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    todo = [t for t in task_names if not (data_dir / f"{t}.hdf5").exists()]
    for t in sorted(set(task_names) - set(todo)):
        log.info("collect: %s exists, skipping", data_dir / f"{t}.hdf5")
    jobs = []
    for t in todo:
        for first in range(0, demos_per_task, episodes_per_job):
            n = min(episodes_per_job, demos_per_task - first)
            jobs.append(
                Job(t, first, n, seed, noise, filter_success, max_attempts=min(4 * n, n + 90), render=render.to_dict(),
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
            "suite": "metaworld",
            "task_name": t,
            "instruction": INSTRUCTIONS[t],
            "env_args": {"suite": "metaworld", "task_name": t, "max_episode_steps": max_episode_steps,
                         "render": render.to_dict()},
            "problem_info": {"language_instruction": INSTRUCTIONS[t]},
            "seed": seed,
            "noise": noise,
            "filter_success": filter_success,
            "images_upright": True,
            "expert_attempts": attempts[t],
        }
        # a task short of demos gets no final file, so that a rerun collects it again instead of skipping it
        complete = collected.get(t, 0) >= demos_per_task
        target = data_dir / f"{t}.hdf5" if complete else data_dir / f".{t}.incomplete.hdf5"
        demos = merge_demo_files(shards, target, attrs)
        for shard in shards:
            shard.unlink()
        n_success = sum(bool(d["success"]) for d in demos)
        stats[t] = {"demos": len(demos), "successes": n_success, "attempts": attempts[t],
                    "mean_length": float(np.mean([d["num_samples"] for d in demos])) if demos else 0.0}
        log.info("collect: %s: %d demos (%d successful) from %d attempts", t, len(demos), n_success, attempts[t])
    return stats

