"""RL estimators compared at equal environment steps: each run's rollout success against the env steps it has
taken (``rl_history.json``) in one PNG, and a table of the stage-1 start and each run's final evaluation.

    python -m benchmarks.compare_estimators --start runs/est/eval_stage1/results.json \
        rloo=runs/est/rl_rloo grpo=runs/est/rl_grpo ... --out benchmarks/results/estimators
Each run folder may hold ``eval_final/results.json`` (its last checkpoint on the evaluation protocol).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ript.utils.atomic import atomic_write_text
from ript.utils.plots import _pyplot, _save


def read_json(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def smoothed(values: list[float], window: int = 3) -> list[float]:
    return [sum(values[max(0, i - window + 1): i + 1]) / len(values[max(0, i - window + 1): i + 1])
            for i in range(len(values))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", help="label=run_dir")
    ap.add_argument("--start", type=Path, help="the stage-1 checkpoint's evaluation results.json")
    ap.add_argument("--out", type=Path, required=True, help="output prefix: <out>.md, <out>.png, <out>.json")
    args = ap.parse_args()
    start = read_json(args.start) if args.start else None
    rows, curves = [], {}
    for item in args.runs:
        label, run = item.split("=", 1)
        history = read_json(Path(run) / "rl_history.json") or []
        final = read_json(Path(run) / "eval_final" / "results.json")
        curves[label] = history
        last = history[-1] if history else {}
        rows.append({"estimator": label, "iterations": last.get("iteration", 0), "env_steps": last.get("env_steps", 0),
                     "episodes": sum(h["episodes"] for h in history),
                     "rollout_success_first": history[0]["success_rate"] if history else None,
                     "rollout_success_last3": (sum(h["success_rate"] for h in history[-3:]) / len(history[-3:])
                                               if history else None),
                     "eval_success": None if final is None else final["success_rate"]})
    lines = ["| estimator | iterations | env steps | episodes | rollout success, first iteration | "
             "rollout success, last 3 | evaluation success |", "| --- | --- | --- | --- | --- | --- | --- |"]
    if start is not None:
        lines.append(f"| stage 1 (start) | 0 | 0 | 0 | | | {100 * start['success_rate']:.1f}% |")
    pct = lambda v: "" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    for r in rows:
        lines.append(f"| {r['estimator']} | {r['iterations']} | {r['env_steps']:,} | {r['episodes']:,} | "
                     f"{pct(r['rollout_success_first'])} | {pct(r['rollout_success_last3'])} | "
                     f"{pct(r['eval_success'])} |")
    table = "\n".join(lines)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.md").write_text(table + "\n")
    atomic_write_text(Path(f"{args.out}.json"), json.dumps({"start": None if start is None else start["success_rate"],
                                                     "runs": rows, "curves": curves}, indent=1))
    print(table)
    plt = _pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    try:
        for label, history in curves.items():
            if history:
                line, = ax.plot([h["env_steps"] for h in history],
                                smoothed([100 * h["success_rate"] for h in history]), marker=".", label=label)
                final = next(r["eval_success"] for r in rows if r["estimator"] == label)
                if final is not None:
                    ax.scatter([history[-1]["env_steps"]], [100 * final], marker="*", s=90, color=line.get_color())
        if start is not None:
            ax.axhline(100 * start["success_rate"], color="grey", linestyle="--", linewidth=1, label="stage 1 (eval)")
        ax.set_xlabel("environment steps")
        ax.set_ylabel("success (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title("rollout success (3-iteration mean); stars: final evaluation", fontsize=9)
        _save(fig, Path(f"{args.out}.png"))
    finally:
        plt.close(fig)


if __name__ == "__main__":
    main()
