"""How long an env worker takes to build a task (the env, its renderer, the first reset with its frame) while
``--processes`` workers build at once, as RL's env workers do when their slots meet new tasks.

MetaWorld: each task in a GL context of its own (``own``) against all of a process's tasks in one shared context
(``shared``, ``SharedGLContext``), and the host memory each task kept built adds. LIBERO: every build compiling
its scene (``compile``) against the env workers' shared folder of compiled scenes (``compiled``,
``ript.envs.compiled_scenes``), fresh for the measurement as for a run, so that the first build of each scene
compiles it.

    python -m benchmarks.task_build_speed [--suite metaworld] [--processes 16] [--tasks 6] [--out build.json]
    python -m benchmarks.task_build_speed --suite libero_10 --tasks 10 --rounds 2
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

from benchmarks.results_file import write_or_print

MODES = {"metaworld": ("own", "shared"), "libero": ("compile", "compiled")}


def resident_mib() -> float:
    """This process's resident host memory (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def build_all(suite_name: str, names: list[str], render: dict, mode: str, compiled) -> tuple[list[float], list[float]]:
    """Seconds each task of ``names`` took to build and reset, in order, in this process; and where built tasks
    are kept, the host memory each new one added (the first also starts the renderer, so it is left out)."""
    from ript.envs.rendering import SharedGLContext
    from ript.envs.suites import get_suite

    suite, gl = get_suite(suite_name), SharedGLContext() if mode == "shared" else None
    # MetaWorld's tasks stay built, several in one GL context; a LIBERO scene holds ~1 GiB, and an env slot keeps
    # one: the next build replaces it
    keep = mode in MODES["metaworld"]
    seconds, kept, added_mib = [], [], []
    for i, name in enumerate(names):
        t0, before = time.perf_counter(), resident_mib()
        task = suite.make_task(name, render, 200, gl, compiled if mode == "compiled" else None)
        task.reset(10**9, render=True)
        seconds.append(time.perf_counter() - t0)
        if keep:
            kept.append(task)
            if 0 < i < len(set(names)):
                added_mib.append(resident_mib() - before)
        else:
            task.close()
    for task in kept:
        task.close()
    if gl is not None:
        gl.close()
    return seconds, added_mib


def measure(suite: str, processes: int, names: list[str], rounds: int, render: dict, mode: str) -> dict:
    """Every process builds every task ``rounds`` times (each starting at another task), all at once."""
    from ript.envs.compiled_scenes import CompiledScenes

    compiled = CompiledScenes.create() if mode == "compiled" else None
    orders = [(names[i % len(names):] + names[:i % len(names)]) * rounds for i in range(processes)]
    t0 = time.perf_counter()
    try:
        with mp.get_context("spawn").Pool(processes) as pool:
            built = pool.starmap(build_all, [(suite, order, render, mode, compiled) for order in orders])
    finally:
        if compiled is not None:
            compiled.remove()
    wall = time.perf_counter() - t0
    times, added = [b[0] for b in built], [mib for b in built for mib in b[1]]
    later = [t for per_process in times for t in per_process[1:]]  # a process's first build also starts EGL
    return {"median_build_s": statistics.median(later), "mean_build_s": statistics.fmean(later),
            "first_build_s": statistics.median(t[0] for t in times), "wall_s": wall,
            "builds": processes * len(names) * rounds,
            **({"host_mib_per_kept_task": statistics.median(added)} if added else {})}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="metaworld", help="metaworld or a LIBERO suite (libero_10, ...)")
    ap.add_argument("--processes", type=int, default=16)
    ap.add_argument("--tasks", type=int, default=6, help="the suite's first N tasks (MetaWorld: ML45's train split)")
    ap.add_argument("--rounds", type=int, default=1, help="times each process builds every task")
    ap.add_argument("--image-size", type=int, default=128)
    ap.add_argument("--cameras", default=None, help="default: the suite's two cameras")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from ript.envs.libero import is_libero_suite, suite_tasks
    from ript.envs.metaworld import benchmark_tasks

    family = "libero" if is_libero_suite(a.suite) else "metaworld"
    names = (suite_tasks(a.suite) if family == "libero" else benchmark_tasks("ML45", "train"))[:a.tasks]
    cameras = a.cameras or ("agentview,eye_in_hand" if family == "libero" else "corner,gripperPOV")
    render = {"cameras": cameras.split(","), "image_size": a.image_size, "quality": "low"}
    result = {"suite": a.suite, "processes": a.processes, "tasks": names, "rounds": a.rounds, "render": render,
              "rows": {}}
    for mode in MODES[family]:
        result["rows"][mode] = measure(a.suite, a.processes, names, a.rounds, render, mode)
        print(mode, result["rows"][mode], flush=True)
    write_or_print(result, a.out)


if __name__ == "__main__":
    main()
