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
import logging
import statistics
import tempfile
import time
from pathlib import Path

from ript.utils.atomic import atomic_write_text

DEFAULT_OVERRIDES = [
    "task=metaworld_quick",
    "task.task_names=[button-press-v3,drawer-close-v3,assembly-v3,pick-place-v3,peg-insert-side-v3,door-open-v3]",
    "task.demos_per_task=8", "task.render.image_size=32", "episodes_per_job=2", "num_workers=2",
]


class TimeSpent(logging.Handler):
    """Keeps collect's own account of where the workers' time went (its log line)."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("collect:") and "busy" in message:
            self.lines.append(message)


def measure(overrides: list[str]) -> dict:
    """Seconds of one collection into a fresh folder, and collect's account of the workers' time."""
    from ript.config import compose
    from ript.stages import collect
    from ript.utils.logging import log

    spent = TimeSpent()
    log.addHandler(spent)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = compose("collect", [*overrides, f"task.data_dir={tmp}"])
            t0 = time.perf_counter()
            collect.run(cfg)
            return {"wall_s": time.perf_counter() - t0, "time_spent": spent.lines}
    finally:
        log.removeHandler(spent)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("overrides", nargs="*", help="ript collect's overrides (default: six MetaWorld tasks)")
    args = ap.parse_args()
    overrides = args.overrides or DEFAULT_OVERRIDES
    runs = [measure(overrides) for _ in range(args.repeats)]
    walls = [r["wall_s"] for r in runs]
    result = {"overrides": overrides, "runs": runs, "wall_s_mean": statistics.mean(walls)}
    print("collect wall: " + ", ".join(f"{w:.1f}" for w in walls) + f" s (mean {result['wall_s_mean']:.1f})")
    if args.out:
        atomic_write_text(Path(args.out), json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
