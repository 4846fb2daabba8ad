"""A learning-rate rule for larger batches, checked at equal samples seen: stage 1 at the base batch and rate,
then at a larger batch with the rate left alone (``none``) or scaled by ``sqrt`` / ``linear``, each run seeing the
same number of samples (steps and warm-up divided by the batch ratio); the validation loss at the end and the
success of the last checkpoint in the simulator.

    python -m benchmarks.lr_scaling --stage0 <stage-0 run> [--task metaworld_quick] [--algo quest_small]
        [--base-batch 64] [--base-lr 1e-3] [--base-steps 1200] [--batch 256] [--episodes 20] [--out <file.json>]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.results_file import write_or_print


def ript(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "ript.cli", *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"ript {args[0]} failed:\n{done.stderr[-2000:]}")
    return done.stdout + done.stderr


def last_validation(log: str) -> dict[str, float]:
    """The metrics of the last 'stage1 step N: key value, ...' line (printed at each validation)."""
    line = [ln for ln in log.splitlines() if re.search(r"stage1 step \d+:", ln)][-1]
    return {k: float(v) for k, v in re.findall(r"(\w+) ([-0-9.]+)", line.split(":", 3)[-1])}


def one_run(args, rule: str, batch: int, root: Path) -> dict:
    ratio = batch // args.base_batch
    steps, warmup = args.base_steps // ratio, max(1, 100 // ratio)
    run = root / f"{rule}_{batch}"
    log = ript("stage1", f"task={args.task}", f"algo={args.algo}", f"stage0_checkpoint={args.stage0}", f"run_dir={run}",
               f"train.batch_size={batch}", f"train.steps={steps}", f"train.warmup_steps={warmup}",
               f"train.lr={args.base_lr}", f"train.lr_scaling={rule}", f"train.lr_reference_batch={args.base_batch}",
               f"train.val_every={steps}", f"train.save_every={steps}", "progress=false")
    ript("eval", f"checkpoint={run}", f"episodes_per_task={args.episodes}", f"out_dir={run / 'eval'}")
    results = json.loads((run / "eval" / "results.json").read_text())
    return {"rule": rule, "batch": batch, "steps": steps, "samples": steps * batch,
            "validation": last_validation(log), "success_rate": results["success_rate"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stage0", required=True)
    ap.add_argument("--task", default="metaworld_quick")
    ap.add_argument("--algo", default="quest_small")
    ap.add_argument("--base-batch", type=int, default=64)
    ap.add_argument("--base-lr", type=float, default=1e-3)
    ap.add_argument("--base-steps", type=int, default=1200)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--episodes", type=int, default=20, help="evaluation episodes per task")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rule, batch in [("none", args.base_batch), ("none", args.batch), ("sqrt", args.batch),
                            ("linear", args.batch)]:
            rows.append(one_run(args, rule, batch, Path(tmp)))
            r = rows[-1]
            print(f"batch {batch:>5} {rule:>6}: {r['steps']} steps, validation {r['validation']}, "
                  f"success {100 * r['success_rate']:.1f}%", flush=True)
    write_or_print({"settings": vars(args), "rows": rows}, args.out)


if __name__ == "__main__":
    main()
