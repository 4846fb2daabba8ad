"""An evaluation's results: the summary of its episodes (per task and overall), the success table printed after
it, and its files (``results.json``, ``success.png``, ``first_frames.png``) under ``<run_dir>/eval/step<N>`` or
a folder of the user's choice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ript.errors import RiptError
from ript.utils.atomic import atomic_write_text
from ript.utils.plots import frames_grid, success_bars


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """An env runner's results with per-task and overall success (the mean over tasks) in front, in a fixed
    order."""
    per_task: dict[str, dict[str, Any]] = {}
    for e in run["episodes"]:
        t = per_task.setdefault(e["task"], {"episodes": 0, "successes": 0, "lengths": []})
        t["episodes"] += 1
        t["successes"] += int(e["success"])
        t["lengths"].append(e["length"])
    for t in per_task.values():
        t["success_rate"] = t["successes"] / t["episodes"]
        t["mean_length"] = float(np.mean(t.pop("lengths")))
    rates = [t["success_rate"] for t in per_task.values()]
    return {"success_rate": float(np.mean(rates)) if rates else 0.0, "per_task": dict(sorted(per_task.items())),
            **run}


def success_table(results: dict[str, Any]) -> str:
    rows = [f"{'task':<32} {'success':>8} {'episodes':>9} {'mean len':>9}"]
    for name, t in results["per_task"].items():
        rows.append(f"{name:<32} {t['success_rate']:>8.1%} {t['episodes']:>9d} {t['mean_length']:>9.1f}")
    rows.append(f"{'average':<32} {results['success_rate']:>8.1%}")
    return "\n".join(rows)


def write_results(path: Path, results: dict[str, Any]) -> None:
    """The results as JSON, less the first frames (pictures, written as ``first_frames.png``)."""
    atomic_write_text(Path(path), json.dumps({k: v for k, v in results.items() if k != "first_frames"}, indent=2))


def write_evaluation(out_dir: Path, results: dict[str, Any], title: str = "") -> None:
    """An evaluation's files: ``results.json``, ``success.png`` (per-task success bars) and ``first_frames.png``
    (each task's first view in its first episode, the cameras side by side)."""
    write_results(out_dir / "results.json", results)
    success_bars(results, out_dir / "success.png", title)
    frames_grid(results.get("first_frames") or {}, out_dir / "first_frames.png")


def results_dir(out_dir: Path, overwrite: bool) -> Path:
    """An evaluation's output folder, refused if it already holds results and ``overwrite`` is not set."""
    if (out_dir / "results.json").exists() and not overwrite:
        raise RiptError(f"{out_dir / 'results.json'} exists; pass overwrite=true to replace it or out_dir=<folder>")
    return out_dir


def evaluation_dir(run_dir: Path, step: int) -> Path:
    """``<run_dir>/eval/step<N>``: where the evaluation of a run's checkpoint ``step`` writes its results and videos
    (during training, or by ``ript eval``)."""
    return Path(run_dir) / "eval" / f"step{step:07d}"


def checkpoint_results_dir(ckpt: dict, out_dir: str | None, overwrite: bool) -> tuple[Path, str]:
    """(results folder, the plots' title) of an evaluation of a ript checkpoint: ``out_dir``, or
    ``<run_dir>/eval/step<N>`` for a checkpoint inside a run folder; never replaces an earlier results.json
    unless ``overwrite``."""
    ckpt_dir = Path(ckpt["checkpoint_dir"])
    if out_dir:
        folder = Path(out_dir)
    elif ckpt_dir.parent.name == "checkpoints":
        folder = evaluation_dir(ckpt_dir.parent.parent, int(ckpt["step"]))
    else:
        raise RiptError(f"checkpoint {ckpt_dir} is not inside a run folder (<run_dir>/checkpoints/<step>); "
                        f"pass out_dir=<folder> for the results")
    return results_dir(folder, overwrite), f"{ckpt_dir.parent.parent.name} step {ckpt['step']}"
