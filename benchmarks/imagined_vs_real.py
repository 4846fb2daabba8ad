"""Does imagined success track real success? Each checkpoint (at least five: a run's imitation steps, its RL
iterations, other runs of the suite) is evaluated on the same initial conditions in the simulator and in a world
model; the table gives both success rates per checkpoint and their Pearson correlation.

    python -m benchmarks.imagined_vs_real --world-model runs/libero_object/world_model \
        --checkpoints runs/a/checkpoints/0001000 runs/a/checkpoints/0002000 runs/b ... \
        --episodes 10 --out benchmarks/results/<file>.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ript.config import compose, override
from ript.policies.families import checkpoint_model
from ript.registry import POLICIES
from ript.stages.evaluate import run as evaluate
from ript.utils.atomic import atomic_write_text


def success(checkpoint: str, out_dir: Path, episodes: int, workers: str, extra: list[str]) -> float:
    family = checkpoint_model(checkpoint)  # a flow or π0 run names its family, as `ript eval` reads it
    policy = [f"policy={family}"] if family in POLICIES.names() else []
    cfg = compose("eval", [*policy, override("checkpoint", checkpoint), override("out_dir", out_dir),
                           f"episodes_per_task={episodes}", f"num_workers={workers}", "n_videos=0", "overwrite=true",
                           *extra])
    return float(evaluate(cfg)["success_rate"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-model", required=True)
    p.add_argument("--checkpoints", nargs="+", required=True)
    p.add_argument("--episodes", type=int, default=10, help="evaluation episodes per task, in each environment")
    p.add_argument("--workers", default="auto")
    p.add_argument("--work-dir", type=Path, default=Path("runs/imagined_vs_real"))
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    imagined = ["environment=world_model", override("environment.checkpoint", args.world_model)]
    rows = []
    for i, ckpt in enumerate(args.checkpoints):
        real = success(ckpt, args.work_dir / f"{i:02d}_real", args.episodes, args.workers, [])
        dream = success(ckpt, args.work_dir / f"{i:02d}_imagined", args.episodes, args.workers, imagined)
        rows.append({"checkpoint": ckpt, "real": real, "imagined": dream})
        print(f"{ckpt}: real {100 * real:.1f}%, imagined {100 * dream:.1f}%", flush=True)
    real, dream = np.array([r["real"] for r in rows]), np.array([r["imagined"] for r in rows])
    pearson = float(np.corrcoef(real, dream)[0, 1]) if len(rows) > 1 and real.std() and dream.std() else None
    result = {"world_model": args.world_model, "episodes_per_task": args.episodes, "checkpoints": rows,
              "pearson": pearson, "mean_abs_gap": float(np.abs(real - dream).mean())}
    print(json.dumps({k: result[k] for k in ("pearson", "mean_abs_gap")}))
    if args.out is not None:
        atomic_write_text(Path(args.out), json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
