"""Wall time of ``ript collect`` with the given overrides, repeated into fresh data folders.

    MUJOCO_GL=egl python -m benchmarks.collect_speed --repeats 3 \
        --out benchmarks/results/collect_speed_metaworld_6_tasks_cpu.json
    MUJOCO_GL=egl python -m benchmarks.collect_speed --repeats 1 -- task=libero_goal task.demos_per_task=50 \
        episodes_per_job=5 num_workers=16

The default overrides collect six MetaWorld tasks whose episodes differ in length and expert success (button
press ~60 steps at 100%, peg insertion ~150 at ~60%) on two workers, so how the jobs are spread over the workers
shows in the wall time.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

DEFAULT_OVERRIDES = [
    "task=metaworld_quick",
    "task.task_names=[button-press-v3,drawer-close-v3,assembly-v3,pick-place-v3,peg-insert-side-v3,door-open-v3]",
    "task.demos_per_task=8", "task.render.image_size=32", "episodes_per_job=2", "num_workers=2",
]


def measure(overrides: list[str]) -> float:
    """Seconds of one collection into a fresh folder."""
    from ript.config import compose
    from ript.stages import collect

    with tempfile.TemporaryDirectory() as tmp:
        cfg = compose("collect", [*overrides, f"task.data_dir={tmp}"])
        t0 = time.perf_counter()
        collect.run(cfg)
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("overrides", nargs="*", help="ript collect's overrides (default: six MetaWorld tasks)")
    args = ap.parse_args()
    overrides = args.overrides or DEFAULT_OVERRIDES
    walls = [measure(overrides) for _ in range(args.repeats)]
    result = {"overrides": overrides, "wall_s": walls, "wall_s_mean": statistics.mean(walls)}
    print("collect wall: " + ", ".join(f"{w:.1f}" for w in walls) + f" s (mean {result['wall_s_mean']:.1f})")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
