"""Side-by-side validation curves and throughput of training runs, read from their TensorBoard logs.

    python -m benchmarks.train_compare <run dir> [<run dir> ...] [--out summary.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from ript.utils.atomic import atomic_write_text


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--out", default=None)
    ap.add_argument("--tags", default="val/", help="comma-separated prefixes of the scalars to print")
    args = ap.parse_args()
    prefixes = tuple(args.tags.split(","))
    summary = {}
    for run in args.runs:
        s = scalars(Path(run))
        val = {tag: dict(points) for tag, points in s.items() if tag.startswith(prefixes)}
        speed = [v for step, v in s.get("time/samples_per_s", []) if step > 200]  # after compile/warm-up
        summary[run] = {"val": val, "median_samples_per_s": statistics.median(speed) if speed else None}
        print(f"{run}: median {summary[run]['median_samples_per_s'] or 0:.0f} samples/s")
        for tag, points in val.items():
            print(f"  {tag:28s} " + "  ".join(f"{step}:{v:.4g}" for step, v in sorted(points.items())))
    if args.out:
        atomic_write_text(Path(args.out), json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
