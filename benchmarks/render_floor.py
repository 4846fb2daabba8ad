"""The simulator floor with many processes at once: what N worker processes stepping MetaWorld envs (scripted
expert) and rendering through EGL reach together, against N x the one-process rate.

    python -m benchmarks.render_floor --procs 1,8,16 --render-every 1,8 [--render-gpus 0 | 0,1] [--envs 1,4]

``--render-every 1`` is collection's pattern (both cameras every step), 8 a rollout's (the frames a decision
reads), 0 physics and expert only; ``--envs`` envs per process (each its own renderer context, as the
runner's workers host them); ``--renderer separate``: one ``mujoco.Renderer`` render and readback per camera
(the earlier renderer), else MetaWorldTask's side-by-side renderer; ``--render-gpus`` spreads the processes over
the host's GPUs round-robin (``use_render_gpu``). Every process starts timing at one barrier and counts steps
for ``--seconds``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from pathlib import Path

from ript.utils.atomic import atomic_write_text


def _separate_frames(task) -> callable:
    """The earlier renderer: ``mujoco.Renderer``, one render and one readback per camera."""
    import mujoco

    renderer = mujoco.Renderer(task.env.model, task.render_settings.image_size, task.render_settings.image_size)
    flags = renderer.scene.flags
    for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION, mujoco.mjtRndFlag.mjRND_SKYBOX):
        flags[flag] = 0

    def frames():
        for cam in task.render_settings.cameras:
            renderer.update_scene(task.env.data, camera=cam)
            renderer.render()

    return frames


def _report(count, args: tuple, barrier, out) -> None:
    try:
        out.put(count(*args, barrier))
    except Exception as e:  # noqa: BLE001  (reported by the parent, which stops the others)
        barrier.abort()  # the others stop waiting at the barrier
        out.put(f"{type(e).__name__}: {e}")


def at_once(count, per_process: list[tuple], timeout_s: float, label: str) -> list:
    """``count(*args, barrier)`` in one spawned process per entry of ``per_process``, all timing from one
    barrier; their results in arrival order, or exit naming the first process that failed."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(len(per_process)), ctx.Queue()
    workers = [ctx.Process(target=_report, args=(count, args, barrier, out), daemon=True) for args in per_process]
    for w in workers:
        w.start()
    results = [out.get(timeout=timeout_s) for _ in workers]
    for w in workers:
        w.join()
    failed = [r for r in results if isinstance(r, str)]
    if failed:
        raise SystemExit(f"{label}: a worker failed ({failed[0]})")
    return results


def _count_steps(task_name: str, size: int, cameras: tuple, envs: int, render_every: int, seconds: float,
                 render_gpu: int | None, renderer: str, barrier) -> tuple:
    from ript.envs.gl import use_render_gpu

    use_render_gpu(render_gpu)
    import numpy as np

    from ript.envs.metaworld import MetaWorldTask, RenderSettings, expert_policy

    render = RenderSettings(cameras=cameras, image_size=size)
    tasks = [MetaWorldTask(task_name, render, 500) for _ in range(envs)]
    expert = expert_policy(task_name)
    obs = [t.reset(i, render=False) for i, t in enumerate(tasks)]
    draw_frames = [t.render_images if renderer == "side-by-side" else _separate_frames(t) for t in tasks]
    for draw in draw_frames:
        draw()  # first frame: context and texture upload, not timed
    barrier.wait(timeout=300)
    steps, frames, seed = 0, 0, envs
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for i, t in enumerate(tasks):
            action = expert.get_action(obs[i]["env_state"].astype(np.float64))
            obs[i], _, done, _ = t.step(action, render=False)
            draw = render_every > 0 and steps % render_every == 0
            if draw:
                draw_frames[i]()
            frames += draw * len(cameras)
            if done:
                obs[i] = t.reset(seed, render=False)
                seed += 1
        steps += 1
    wall = time.perf_counter() - start
    for t in tasks:
        t.close()
    return steps * envs, frames, wall


def measure(procs: int, envs: int, render_every: int, devices: list[int] | None, task: str = "drawer-close-v3",
            image_size: int = 128, cameras: tuple = ("corner", "gripperPOV"), seconds: float = 6.0,
            renderer: str = "side-by-side") -> dict:
    """Env steps/s that ``procs`` processes of ``envs`` envs each reach together, rendering every
    ``render_every``-th step (0: never)."""
    results = at_once(_count_steps, [(task, image_size, tuple(cameras), envs, render_every, seconds,
                                      devices[i % len(devices)] if devices else None, renderer)
                                     for i in range(procs)], seconds + 400, "render_floor")
    steps = sum(r[0] for r in results)
    wall = max(r[2] for r in results)
    return {"procs": procs, "envs_per_proc": envs, "render_every": render_every, "render_gpus": devices,
            "renderer": renderer,
            "env_steps_per_s": steps / wall, "frames_per_s": sum(r[1] for r in results) / wall,
            "per_proc_steps_per_s": steps / wall / procs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", default="drawer-close-v3")
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--cameras", default="corner,gripperPOV")
    p.add_argument("--procs", default="1,8,16")
    p.add_argument("--envs", default="1")
    p.add_argument("--render-every", default="1,8")
    p.add_argument("--render-gpus", default=None, help="comma list of the host's GPUs to render on, round-robin")
    p.add_argument("--renderer", choices=("side-by-side", "separate"), default="side-by-side",
                   help="all cameras in one buffer and one readback (MetaWorldTask's), or mujoco.Renderer per camera")
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    devices = [int(g) for g in args.render_gpus.split(",")] if args.render_gpus else None
    rows = []
    for every in [int(x) for x in args.render_every.split(",")]:
        for envs in [int(x) for x in args.envs.split(",")]:
            for n in [int(x) for x in args.procs.split(",")]:
                r = measure(n, envs, every, devices, args.task, args.image_size, tuple(args.cameras.split(",")),
                            args.seconds, args.renderer)
                rows.append(r)
                print(f"{args.renderer}: render every {every:>2}, {n:>3} procs x {envs} envs, GPUs "
                      f"{devices or 'default'}: "
                      f"{r['env_steps_per_s']:>8.0f} env steps/s ({r['per_proc_steps_per_s']:.0f} per process, "
                      f"{r['frames_per_s']:.0f} frames/s)", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(args.out), json.dumps({"task": args.task, "image_size": args.image_size, "rows": rows},
                                                     indent=1))


if __name__ == "__main__":
    main()
