"""A model of a collection's wall time on N workers: how ``ript collect`` hands out its jobs (``work_runs``, runs
asked for as workers free up) against splitting them up front into two runs of equal episode counts per worker.

    python -m benchmarks.collect_schedule_model --experts benchmarks/results/experts_libero_90_10_goal_2026-11-26.json
    python -m benchmarks.collect_schedule_model --experts ... --suites libero_10 --workers 32 --step-ms 44 \
        --collect-log benchmarks/results/collect_libero_10_32_workers_2026-11-28.log --draws 20

Each task's episode lasts its mean expert length times ``--step-ms``, and a task takes attempts/successes
episodes per demo (both from the expert benchmark's file); a run opens its task once per task it holds
(``--open-s``), and every worker starts ``--start-s`` late. With the GPU host's figures (52 ms a step, 5 s to open a
LIBERO task) it gives LIBERO-Goal's collection 5.1 min at 69% busy against the measured 5.5 min at 66%
(`protocol_libero_goal_imitation_2026-11-28.log`).

``--collect-log`` takes each task's expert success from a collection's own table instead, its extra failures
running to the suite's step limit. ``--draws N`` draws each demo's failed attempts (geometric, at the task's
success rate) N times and gives the mean and 90th percentile of the wall time: a job's length then varies as it
does in a real collection, which the expected lengths leave out.
"""
from __future__ import annotations

import argparse
import heapq
import json
import re
from pathlib import Path

import numpy as np

from ript.envs.libero import SUITE_HORIZONS
from ript.experts.collect import Collection, Job, work_runs


def jobs_of(suite: str, tasks: list[dict], demos: int, per_job: int) -> list[Job]:
    """The collection's jobs in order, split as ``ript collect`` splits them (nothing is written)."""
    run = Collection(suite, Path("."), demos, {}, None, 0, 0.0, True, "{name}.hdf5")
    return run.jobs([t["task"] for t in tasks], per_job)


def episode_steps(task: dict, success: float | None) -> tuple[float, float, float]:
    """(success rate, steps of a successful episode, steps of a failed one); a collection's own ``success`` replaces
    the benchmark's, and then failures run to the suite's step limit."""
    n, s, mean = task["episodes"], max(task["successes"], 1), task["mean_length"]
    if success is None:
        return s / n, mean, mean  # the benchmark's mean over all its episodes
    horizon = SUITE_HORIZONS[task["suite"]]
    return max(success, 1e-3), max(1.0, (mean * n - (n - s) * horizon) / s), horizon


def job_seconds(jobs: list[Job], steps: dict[str, tuple], step_s: float, rng) -> dict[int, float]:
    """Each job's seconds of episodes: expected (rng None), or with each demo's failed attempts drawn."""
    out = {}
    for job in jobs:
        rate, won, lost = steps[job.task]
        if rng is None:
            fails = job.num_episodes * (1 - rate) / rate
        else:
            fails = float(sum(rng.geometric(rate, job.num_episodes) - 1))
        out[id(job)] = (job.num_episodes * won + fails * lost) * step_s
    return out


def collected_success(log: Path) -> dict[str, float]:
    """Each task's expert success in a collection's table (``task  demos  success%`` lines)."""
    rows = re.findall(r"^(\S+)\s+\d+\s+([\d.]+)%$", log.read_text(), flags=re.MULTILINE)
    return {task: float(rate) / 100 for task, rate in rows}


def run_seconds(run: list[Job], seconds: dict[int, float], open_s: float) -> float:
    return sum(seconds[id(job)] for job in run) + open_s * len({job.task for job in run})


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


def wall(runs, workers: int, seconds: dict[int, float], open_s: float, start_s: float) -> float:
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
    ap.add_argument("--suites", nargs="*", help="the suites to model (default: every suite in --experts)")
    ap.add_argument("--collect-log", type=Path, help="a collection's log: its expert success per task")
    ap.add_argument("--draws", type=int, default=0, help="draws of the failed attempts (0: expected lengths)")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--demos", type=int, default=50, help="per task")
    ap.add_argument("--episodes-per-job", type=int, default=5)
    ap.add_argument("--step-ms", type=float, default=52.0)
    ap.add_argument("--open-s", type=float, default=5.0)
    ap.add_argument("--start-s", type=float, default=10.0)
    a = ap.parse_args()
    tasks = json.loads(a.experts.read_text())["tasks"]
    success = collected_success(a.collect_log) if a.collect_log else {}
    for suite in a.suites or sorted({t["suite"] for t in tasks}):
        mine = [t for t in tasks if t["suite"] == suite]
        steps = {t["task"]: episode_steps(t, success.get(t["task"])) for t in mine}
        jobs = jobs_of(suite, mine, a.demos, a.episodes_per_job)
        rules = {"two equal runs per worker": equal_runs, "runs as workers free up": work_runs}
        walls, work = {name: [] for name in rules}, []
        for draw in range(max(a.draws, 1)):
            seconds = job_seconds(jobs, steps, a.step_ms / 1000, np.random.default_rng(draw) if a.draws else None)
            work.append(sum(seconds.values()))
            for name, rule in rules.items():
                walls[name].append(wall(rule(jobs, a.workers), a.workers, seconds, a.open_s, a.start_s))
        said = []
        for name, times in walls.items():
            busy = np.mean(np.array(work) / (a.workers * np.array(times)))
            p90 = f", 90th percentile {np.percentile(times, 90) / 60:.1f}" if a.draws else ""
            said.append(f"{name} {np.mean(times) / 60:.1f} min ({busy:.0%} busy{p90})")
        print(f"{suite}: {len(jobs)} jobs, {np.mean(work) / 60:.0f} worker-minutes of episodes; " + ", ".join(said))


if __name__ == "__main__":
    main()
