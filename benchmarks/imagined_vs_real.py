"""Does imagined success track real success? Each checkpoint (at least five: a run's imitation steps, its RL
iterations, other runs of the suite) is evaluated on the same initial conditions in the simulator and in a world
model; the table gives both success rates per checkpoint and their Pearson correlation (and, task by task over
the checkpoints, whether the model ranks the tasks as the simulator does), and each checkpoint's
episode-level agreement: of the episodes run from the same initial condition in both, how many ended the same way,
and Cohen's kappa (agreement beyond what the two success rates give by chance: 0 for a model whose outcomes carry
no information about which episodes succeed, even when its success rate matches the simulator's).

    python -m benchmarks.imagined_vs_real --world-model runs/libero_object/world_model \
        --checkpoints runs/a/checkpoints/0001000 runs/a/checkpoints/0002000 runs/b ... \
        --episodes 10 --out benchmarks/results/<file>.json
    # the same checkpoints in another world model, or at a calibrated threshold: the simulator's evaluations in
    # --work-dir are reused where they evaluated the same checkpoint on as many episodes
    python -m benchmarks.imagined_vs_real --world-model <another> --calibration runs/x/calibrate --checkpoints ...
    # at the threshold the head chose on its own held-out imagined episodes (fitted to no policy's outcomes)
    python -m benchmarks.imagined_vs_real --world-model <head> \
        --imagined-overrides environment.success_threshold=head --checkpoints ...
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
from ript.utils.checkpoint import resolve_checkpoint_dir


def evaluated(checkpoint: str, out_dir: Path, episodes: int, workers: str, extra: list[str], reuse: bool = False
              ) -> dict:
    earlier = out_dir / "results.json"
    if reuse and earlier.exists():
        found = json.loads(earlier.read_text())
        same = Path(found["checkpoint"]).resolve() == resolve_checkpoint_dir(checkpoint)
        if same and all(t["episodes"] == episodes for t in found["per_task"].values()):
            return found
    family = checkpoint_model(checkpoint)  # a flow or π0 run names its family, as `ript eval` reads it
    policy = [f"policy={family}"] if family in POLICIES.names() else []
    cfg = compose("eval", [*policy, override("checkpoint", checkpoint), override("out_dir", out_dir),
                           f"episodes_per_task={episodes}", f"num_workers={workers}", "n_videos=0", "overwrite=true",
                           *extra])
    return evaluate(cfg)


def agreement(real: list[dict], imagined: list[dict]) -> dict:
    """Episode by episode (the same task, initial condition and index in both): the four outcomes, the share
    that agree and Cohen's kappa, over all tasks and per task (pooled, a model that only knows which task is the
    easier one already scores above 0)."""
    outcome = {(e["task"], e["seed"], e["episode"]): bool(e["success"]) for e in imagined}
    pairs = [(e["task"], bool(e["success"]), outcome[key]) for e in real
             if (key := (e["task"], e["seed"], e["episode"])) in outcome]
    per_task = {task: kappa_of([(r, i) for t, r, i in pairs if t == task]) for task in sorted({t for t, _, _ in pairs})}
    return {**kappa_of([(r, i) for _, r, i in pairs]), "per_task": per_task}


def kappa_of(pairs: list[tuple[bool, bool]]) -> dict:
    counts = {f"real_{'success' if r else 'failure'}_imagined_{'success' if i else 'failure'}":
              sum(1 for p in pairs if p == (r, i)) for r in (True, False) for i in (True, False)}
    n = max(1, len(pairs))
    agree = sum(r == i for r, i in pairs) / n
    p_real, p_imagined = sum(r for r, _ in pairs) / n, sum(i for _, i in pairs) / n
    chance = p_real * p_imagined + (1 - p_real) * (1 - p_imagined)
    kappa = (agree - chance) / (1 - chance) if chance < 1 else None  # None: both always or never succeed
    return {"paired_episodes": len(pairs), "agreement": agree, "kappa": kappa, **counts}


def correlation(a: list[float], b: list[float]) -> float | None:
    """Pearson's r, None where it is undefined (fewer than two values, or one side constant)."""
    x, y = np.array(a, dtype=float), np.array(b, dtype=float)
    return float(np.corrcoef(x, y)[0, 1]) if len(x) > 1 and x.std() and y.std() else None


def task_ranking(rows: list[dict]) -> dict:
    """Does the model tell the hard tasks from the easy ones? Each task's real and imagined success over all the
    checkpoints, their correlation across tasks, and across every checkpoint-task cell (which the checkpoints'
    own rise also drives)."""
    cells = {}  # task -> [(real, imagined) per checkpoint]
    for row in rows:
        for task, c in row["per_task"].items():
            n = max(1, c["paired_episodes"])
            real = (c["real_success_imagined_success"] + c["real_success_imagined_failure"]) / n
            imagined = (c["real_success_imagined_success"] + c["real_failure_imagined_success"]) / n
            cells.setdefault(task, []).append((real, imagined))
    per_task = {t: {"real": float(np.mean([r for r, _ in v])), "imagined": float(np.mean([i for _, i in v]))}
                for t, v in cells.items()}
    flat = [pair for v in cells.values() for pair in v]
    return {"per_task": per_task,
            "pearson_across_tasks": correlation([v["real"] for v in per_task.values()],
                                                [v["imagined"] for v in per_task.values()]),
            "pearson_across_cells": correlation([r for r, _ in flat], [i for _, i in flat])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-model", required=True)
    p.add_argument("--calibration", default=None, help="a folder of calibration.json: its threshold (else 0.5)")
    p.add_argument("--imagined-overrides", nargs="*", default=[],
                   help="more settings of the imagined evaluation, e.g. environment.success_threshold=head")
    p.add_argument("--checkpoints", nargs="+", required=True)
    p.add_argument("--episodes", type=int, default=10, help="evaluation episodes per task, in each environment")
    p.add_argument("--workers", default="auto")
    p.add_argument("--work-dir", type=Path, default=Path("runs/imagined_vs_real"))
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    imagined = ["environment=world_model", override("environment.checkpoint", args.world_model),
                *([override("environment.calibration", args.calibration)] if args.calibration else []),
                *args.imagined_overrides]
    rows = []
    for i, ckpt in enumerate(args.checkpoints):
        real = evaluated(ckpt, args.work_dir / f"{i:02d}_real", args.episodes, args.workers, [], reuse=True)
        dream = evaluated(ckpt, args.work_dir / f"{i:02d}_imagined", args.episodes, args.workers, imagined)
        row = {"checkpoint": ckpt, "real": float(real["success_rate"]), "imagined": float(dream["success_rate"]),
               **agreement(real["episodes"], dream["episodes"])}
        rows.append(row)
        kappa = "n/a" if row["kappa"] is None else f"{row['kappa']:.2f}"
        print(f"{ckpt}: real {100 * row['real']:.1f}%, imagined {100 * row['imagined']:.1f}%, the same outcome in "
              f"{100 * row['agreement']:.1f}% of {row['paired_episodes']} episodes (kappa {kappa})", flush=True)
    real, dream = np.array([r["real"] for r in rows]), np.array([r["imagined"] for r in rows])
    ranking = task_ranking(rows)
    result = {"world_model": args.world_model, "calibration": args.calibration,
              "imagined_overrides": args.imagined_overrides, "episodes_per_task": args.episodes,
              "checkpoints": rows,
              "pearson": correlation(real, dream), "mean_abs_gap": float(np.abs(real - dream).mean()),
              "tasks": ranking}
    summary = ("pearson", "mean_abs_gap")
    print(json.dumps({**{k: result[k] for k in summary},
                      **{k: ranking[k] for k in ("pearson_across_tasks", "pearson_across_cells")}}))
    if args.out is not None:
        atomic_write_text(Path(args.out), json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
