"""Flow-Noise vs Flow-SDE x PPO (a critic after the action expert) vs GRPO from one flow-policy checkpoint: the
runs' rollout success against environment steps as a table and a PNG, and each run's time.

    python -m benchmarks.flow_rl_comparison <folder with <noise>-<advantage>.json rl histories and times.json>
        [--png FILE] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ript.utils.atomic import atomic_write_text
from ript.utils.plots import compared_curves

RUNS = ("flow_noise-gae", "flow_sde-gae", "flow_noise-grpo", "flow_sde-grpo")
LABELS = {"gae": "PPO", "grpo": "GRPO", "flow_noise": "Flow-Noise", "flow_sde": "Flow-SDE"}


def label(run: str) -> str:
    noise, advantage = run.split("-")
    return f"{LABELS[noise]} + {LABELS[advantage]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--png", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    times = json.loads((args.folder / "times.json").read_text()) if (args.folder / "times.json").is_file() else {}
    histories = {run: json.loads((args.folder / f"{run}.json").read_text()) for run in RUNS
                 if (args.folder / f"{run}.json").is_file()}
    if not histories:
        raise SystemExit(f"{args.folder}: none of {', '.join(r + '.json' for r in RUNS)} (the runs' rl_history.json)")
    common = min(h[-1]["env_steps"] for h in histories.values())  # compared up to the steps every run reached
    rows = []
    print(f"| run | iterations | env steps | rollout success, first | at {common} env steps | last | minutes |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for run, history in histories.items():
        at = [h for h in history if h["env_steps"] <= common][-1]
        row = {"run": run, "iterations": len(history), "env_steps": history[-1]["env_steps"],
               "first": history[0]["success_rate"], "at_common": at["success_rate"],
               "last": history[-1]["success_rate"],
               "minutes": None if times.get(run) is None else times[run] / 60}
        rows.append(row)
        minutes = f"{row['minutes']:.1f}" if row["minutes"] is not None else "-"
        print(f"| {label(run)} | {row['iterations']} | {row['env_steps']} | {row['first']:.1%} | "
              f"{row['at_common']:.1%} | {row['last']:.1%} | {minutes} |")
    if args.png:
        compared_curves({label(r): h for r, h in histories.items()}, args.png, "RL from one flow checkpoint")
    if args.out:
        atomic_write_text(Path(args.out), json.dumps({"common_env_steps": common, "runs": rows}, indent=2))


if __name__ == "__main__":
    main()
