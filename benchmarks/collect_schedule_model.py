"""A model of a collection's wall time on N workers: how ``ript collect`` hands out its jobs (``work_runs``, runs
asked for as workers free up) against splitting them up front into two runs of equal episode counts per worker.

    python -m benchmarks.collect_schedule_model --experts benchmarks/results/experts_libero_90_10_goal_2026-11-26.json

Each task's episode lasts its mean expert length times ``--step-ms``, and a task takes attempts/successes
episodes per demo (both from the expert benchmark's file); a run opens its task once per task it holds
(``--open-s``), and every worker starts ``--start-s`` late. With the GPU host's figures (52 ms a step, 5 s to open a
LIBERO task) it gives LIBERO-Goal's collection 5.1 min at 69% busy against the measured 5.5 min at 66%
(`protocol_libero_goal_imitation_2026-11-28.log`).
"""
from __future__ import annotations

import argparse
import heapq
import json
from pathlib import Path

from ript.experts.collect import Job, work_runs


def jobs_of(tasks: list[dict], demos: int, per_job: int, step_s: float) -> tuple[list[Job], dict[str, float]]:
    """The collection's jobs in order, and each task's seconds per demo."""
    seconds = {t["task"]: t["mean_length"] * step_s * t["episodes"] / max(t["successes"], 1) for t in tasks}
    jobs = [Job(t["suite"], t["task"], first, per_job, 0, 0.0, True, 1, {}, 0, "")
            for t in tasks for first in range(0, demos, per_job)]
    return jobs, seconds


def run_seconds(run: list[Job], seconds: dict[str, float], open_s: float) -> float:
    return sum(job.num_episodes * seconds[job.task] for job in run) + open_s * len({job.task for job in run})


def equal_runs(jobs: list[Job], workers: int) -> list[list[Job]]:
    """Two runs per worker of about equal episode counts, in order, all handed out at the start."""
    n, total = max(1, min(len(jobs), 2 * workers)), sum(job.num_episodes for job in jobs)
    runs, done = [[]], 0
    for job in jobs:
        if done >= total * len(runs) / n and runs[-1]:
            runs.append([])
        runs[-1].append(job)
        done += job.num_episodes
    return runs


def wall(runs, workers: int, seconds: dict[str, float], open_s: float, start_s: float) -> float:
    """Each run goes to the worker that frees up first, in the order the runs come."""
    free = [start_s] * workers
    end = 0.0
    for run in runs:
        t = heapq.heappop(free) + run_seconds(run, seconds, open_s)
        end = max(end, t)
        heapq.heappush(free, t)
    return end


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experts", type=Path, required=True, help="a benchmarks.libero_experts result file")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--demos", type=int, default=50, help="per task")
    ap.add_argument("--episodes-per-job", type=int, default=5)
    ap.add_argument("--step-ms", type=float, default=52.0)
    ap.add_argument("--open-s", type=float, default=5.0)
    ap.add_argument("--start-s", type=float, default=10.0)
    a = ap.parse_args()
    tasks = json.loads(a.experts.read_text())["tasks"]
    for suite in sorted({t["suite"] for t in tasks}):
        jobs, seconds = jobs_of([t for t in tasks if t["suite"] == suite], a.demos, a.episodes_per_job,
                                a.step_ms / 1000)
        work = sum(job.num_episodes * seconds[job.task] for job in jobs)
        split = wall(equal_runs(jobs, a.workers), a.workers, seconds, a.open_s, a.start_s)
        asked = wall(work_runs(jobs, a.workers), a.workers, seconds, a.open_s, a.start_s)
        print(f"{suite}: {len(jobs)} jobs, {work / 60:.0f} worker-minutes of episodes; two equal runs per worker "
              f"{split / 60:.1f} min ({work / (a.workers * split):.0%} busy), runs as workers free up "
              f"{asked / 60:.1f} min ({work / (a.workers * asked):.0%} busy)")


if __name__ == "__main__":
    main()
