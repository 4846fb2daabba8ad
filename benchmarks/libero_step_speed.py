"""LIBERO's simulator floor with many processes at once: env steps/s of N processes each stepping one LIBERO
task (random arm actions) and rendering its two cameras every k-th step, against N x the one-process rate.

    MUJOCO_GL=egl python -m benchmarks.libero_step_speed --procs 1,16 --render-every 0,1,8 [--suite libero_object]

``--render-every 0`` is physics only, 1 collection's pattern (both cameras every step), 8 a rollout's. Each
process also splits its time into robosuite's ``env.step`` and the camera renders, so a host that reaches a
fraction of the per-core rate shows whether physics or rendering lost it. Every process starts timing at one
barrier and counts steps for ``--seconds``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from benchmarks.render_floor import at_once
from ript.utils.atomic import atomic_write_text


def _count_steps(suite: str, task_index: int, render_every: int, seconds: float, barrier) -> dict:
    import numpy as np

    from ript.envs.suites import get_suite

    s = get_suite(suite)
    name = s.task_names({"task_names": None})[task_index]
    task = s.make_task(name, {"cameras": ["agentview", "eye_in_hand"], "image_size": 128, "quality": "low"},
                       s.horizon)
    rng = np.random.default_rng(task_index)
    task.reset(s.initial_conditions or 0, render=True)  # first frame: GL context and textures, not timed
    barrier.wait(timeout=300)
    steps = 0
    step_s = render_s = 0.0
    start = time.perf_counter()
    reset_s, done = 0.0, False
    while time.perf_counter() - start - reset_s < seconds:
        if done:  # robosuite's own horizon; the reset is not timed
            t = time.perf_counter()
            task.reset(steps, render=False)
            reset_s += time.perf_counter() - t
        t0 = time.perf_counter()
        task.env.step(np.concatenate([rng.uniform(-0.3, 0.3, 6), [-1.0]]))
        done = task.env.env.done  # robosuite env inside LIBERO's wrapper
        t1 = time.perf_counter()
        if render_every and steps % render_every == 0:
            task.raw_images()
        render_s += time.perf_counter() - t1
        step_s += t1 - t0
        steps += 1
    wall = time.perf_counter() - start - reset_s
    task.close()
    return {"steps": steps, "wall": wall, "step_ms": 1e3 * step_s / steps, "render_ms": 1e3 * render_s / steps}


def measure(suite: str, procs: int, render_every: int, seconds: float) -> dict:
    results = at_once(_count_steps, [(suite, i % 10, render_every, seconds) for i in range(procs)], seconds + 600,
                      "libero_step_speed")
    steps, wall = sum(r["steps"] for r in results), max(r["wall"] for r in results)
    return {"suite": suite, "procs": procs, "render_every": render_every, "env_steps_per_s": steps / wall,
            "per_proc_steps_per_s": steps / wall / procs,
            "step_ms": sum(r["step_ms"] for r in results) / procs,
            "render_ms_per_step": sum(r["render_ms"] for r in results) / procs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--suite", default="libero_object")
    p.add_argument("--procs", default="1,16")
    p.add_argument("--render-every", default="0,1,8")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    rows = []
    print(f"cpus {os.cpu_count()}  MUJOCO_GL={os.environ.get('MUJOCO_GL')}")
    for every in [int(x) for x in a.render_every.split(",")]:
        for procs in [int(x) for x in a.procs.split(",")]:
            r = measure(a.suite, procs, every, a.seconds)
            rows.append(r)
            print(f"render every {every}  procs {procs:3d}  {r['env_steps_per_s']:8.1f} env steps/s  "
                  f"({r['per_proc_steps_per_s']:.1f} per process; env.step {r['step_ms']:.1f} ms, "
                  f"renders {r['render_ms_per_step']:.1f} ms per step)", flush=True)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(a.out), json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
