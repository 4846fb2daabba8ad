"""What recording episodes as demonstration files (``ript eval record_episodes=true``) costs the driving process:
episodes of a LIBERO evaluation's size (two 128-px cameras, ~170 steps) handed to ``EpisodeFiles`` as the env
runner hands them, against the same episodes stacked and written in the calling thread (how they were written
before the writer thread). Between two episodes the caller waits ``--gap-ms`` (a 500-episode LIBERO evaluation at
~620 env steps/s ends an episode every ~330 ms, and its driving process spends most of that waiting on its env
workers). The frames are smooth images with a little noise, so that compression works as on rendered scenes.

    python -m benchmarks.episode_recording [--episodes 40] [--steps 170] [--size 128] [--gap-ms 330] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.results_file import write_or_print
from ript.data.hdf5 import Demo, merge_demo_files, write_demo_file
from ript.evaluation.recording import EpisodeFiles

CAMERAS = ("agentview_rgb", "eye_in_hand_rgb")
METADATA = {"suite": "libero_object", "env_args": {}}


def episodes(count: int, steps: int, size: int) -> list[dict]:
    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 200, size, dtype=np.float32)
    scene = (ramp[:, None, None] * 0.5 + ramp[None, :, None] * 0.5 + np.array([0, 20, 40])).astype(np.uint8)
    out = []
    for e in range(count):
        obs = [{**{cam: scene + rng.integers(0, 6, scene.shape, dtype=np.uint8) for cam in CAMERAS},
                "ee_states": rng.normal(size=6).astype(np.float32)} for _ in range(steps)]
        out.append({"task": "pick_up_the_milk", "seed": e, "episode": 0, "success": bool(e % 2),
                    "steps": {"obs": obs, "actions": [rng.normal(size=7) for _ in range(steps)]}})
    return out


def in_calling_thread(folder: Path, handed: list[dict], gap: float) -> float:
    """Each episode stacked and written before the call returns; the seconds the caller spent."""
    spent, parts = 0.0, []
    for i, e in enumerate(handed):
        time.sleep(gap)
        t = time.perf_counter()
        steps, n = e["steps"], len(e["steps"]["actions"])
        demo = Demo(actions=np.stack(steps["actions"]).astype(np.float32),
                    obs={k: np.stack([o[k] for o in steps["obs"]]) for k in steps["obs"][0]},
                    rewards=np.zeros(n, np.uint8), dones=np.zeros(n, np.uint8), attrs={"success": e["success"]})
        parts.append(folder / f".part{i}.hdf5")
        write_demo_file(parts[-1], [demo], {"task_name": e["task"]})
        spent += time.perf_counter() - t
    merge_demo_files(parts, folder / "merged.hdf5", {"task_name": "pick_up_the_milk"})
    return spent


def through_writer(folder: Path, handed: list[dict], gap: float) -> tuple[float, float]:
    """The seconds the caller spent handing the episodes over, and in ``finish`` (the rest of the writing)."""
    files = EpisodeFiles(folder, METADATA, {"pick_up_the_milk": "pick up the milk"})
    handing = 0.0
    for e in handed:
        time.sleep(gap)
        t = time.perf_counter()
        files(e)
        handing += time.perf_counter() - t
    t = time.perf_counter()
    files.finish()
    return handing, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=40)
    ap.add_argument("--steps", type=int, default=170)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--gap-ms", type=float, default=330.0)
    ap.add_argument("--out")
    a = ap.parse_args()
    handed = episodes(a.episodes, a.steps, a.size)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "a").mkdir()
        t = time.perf_counter()
        caller = in_calling_thread(Path(tmp) / "a", handed, a.gap_ms / 1000)
        sync_wall = time.perf_counter() - t
        t = time.perf_counter()
        handing, finishing = through_writer(Path(tmp) / "b", handed, a.gap_ms / 1000)
        writer_wall = time.perf_counter() - t
    per = 1000 / a.episodes
    write_or_print({
        "what": "the driving thread's time per recorded episode, written in the calling thread vs handed to "
                "EpisodeFiles' writer thread (finish waits for the rest)",
        "cpu": f"{os.cpu_count()} cores", "episodes": a.episodes, "steps": a.steps, "image_size": a.size,
        "cameras": len(CAMERAS), "gap_ms": a.gap_ms,
        "in_calling_thread": {"caller_ms_per_episode": caller * per, "wall_s": sync_wall},
        "writer_thread": {"caller_ms_per_episode": handing * per, "finish_s": finishing, "wall_s": writer_wall},
    }, a.out)


if __name__ == "__main__":
    main()
