"""How long an env worker takes to build a MetaWorld task (the env, its renderer, the first reset with its frame)
while ``--processes`` workers build at once, as RL's env workers do when their slots meet new tasks: each task in
a GL context of its own, against all of a process's tasks in one shared context (``SharedGLContext``).

    python -m benchmarks.task_build_speed [--processes 16] [--tasks 6] [--image-size 128] [--out build.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time
from pathlib import Path

from ript.envs.metaworld import benchmark_tasks

MODES = ("own", "shared")


def build_all(names: list[str], render: dict, shared: bool) -> list[float]:
    """Seconds each task of ``names`` took to build and reset, in order, in this process."""
    from ript.envs.rendering import SharedGLContext
    from ript.envs.suites import get_suite

    suite, gl = get_suite("metaworld"), SharedGLContext() if shared else None
    seconds, tasks = [], []
    for name in names:
        t0 = time.perf_counter()
        task = suite.make_task(name, render, 200, gl)
        task.reset(0, render=True)
        seconds.append(time.perf_counter() - t0)
        tasks.append(task)
    for task in tasks:
        task.close()
    if gl is not None:
        gl.close()
    return seconds


def measure(processes: int, names: list[str], render: dict, shared: bool) -> dict:
    """Every process builds every task (each starting at another one), all at once."""
    orders = [names[i % len(names):] + names[:i % len(names)] for i in range(processes)]
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(processes) as pool:
        times = pool.starmap(build_all, [(order, render, shared) for order in orders])
    wall = time.perf_counter() - t0
    later = [t for per_process in times for t in per_process[1:]]  # a process's first build also starts EGL
    return {"median_build_s": statistics.median(later), "first_build_s": statistics.median(t[0] for t in times),
            "wall_s": wall, "builds": processes * len(names)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--processes", type=int, default=16)
    ap.add_argument("--tasks", type=int, default=6, help="the first N tasks of ML45's train split")
    ap.add_argument("--image-size", type=int, default=128)
    ap.add_argument("--cameras", default="corner,gripperPOV")
    ap.add_argument("--out", default="runs/task_build_speed.json")
    a = ap.parse_args()
    names = benchmark_tasks("ML45", "train")[:a.tasks]
    render = {"cameras": a.cameras.split(","), "image_size": a.image_size, "quality": "low"}
    result = {"processes": a.processes, "tasks": names, "render": render, "rows": {}}
    for mode in MODES:
        result["rows"][mode] = measure(a.processes, names, render, mode == "shared")
        print(mode, json.dumps(result["rows"][mode]), flush=True)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
