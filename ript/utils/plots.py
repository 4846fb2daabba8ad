"""Pictures of results as PNG files: per-task success of an evaluation, each task's first view, and RL's
success curves.

matplotlib draws off-screen (Agg). It is a dependency of ript, but the offline GPU host runs with a minimal
set of wheels: there a missing matplotlib costs one warning and the pictures, never the run. Files are
written atomically, like every other output.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from ript.utils.atomic import atomic_write_bytes
from ript.utils.logging import log


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: no PNG pictures of the results (pip install matplotlib)")
        return None
    return plt


def _save(fig, path: Path) -> Path:
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110, bbox_inches="tight")
    atomic_write_bytes(path, png.getvalue())
    return path


def success_bars(results: dict[str, Any], path: Path, title: str = "") -> Path | None:
    """One horizontal bar per task (success rate, with successes/episodes), the average as a line."""
    plt = _pyplot()
    if plt is None:
        return None
    tasks = list(results["per_task"])
    rates = [100 * results["per_task"][t]["success_rate"] for t in tasks]
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(tasks) + 1.4))
    try:
        ax.barh(range(len(tasks)), rates, color="#4c78a8")
        ax.set_yticks(range(len(tasks)), tasks, fontsize=8)
        ax.invert_yaxis()
        for i, t in enumerate(tasks):
            r = results["per_task"][t]
            ax.text(min(rates[i], 88) + 1, i, f"{r['successes']}/{r['episodes']}", va="center", fontsize=7)
        average = 100 * results["success_rate"]
        ax.axvline(average, color="#e45756", lw=1)
        ax.set_xlim(0, 100)
        ax.set_xlabel("success (%)")
        ax.set_title(f"{title + ': ' if title else ''}average {average:.1f}% over {len(tasks)} tasks", fontsize=9)
        return _save(fig, path)
    finally:
        plt.close(fig)


def frames_grid(frames: dict[str, Any], path: Path, columns: int = 5) -> Path | None:
    """Images (name -> HxWx3 uint8) in a grid, each titled with its name: what each task's scene looks like."""
    plt = _pyplot()
    if plt is None or not frames:
        return None
    names = list(frames)
    cols = min(columns, len(names))
    rows = -(-len(names) // cols)
    height, width = next(iter(frames.values())).shape[:2]
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.6 * rows * height / width + 0.4), squeeze=False)
    try:
        for ax in axes.flat:
            ax.axis("off")
        for ax, name in zip(axes.flat, names):
            ax.imshow(frames[name])
            ax.set_title(name if len(name) <= 36 else name[:33] + "...", fontsize=7)
        return _save(fig, path)
    finally:
        plt.close(fig)


def rl_curves(history: list[dict[str, Any]], path: Path) -> Path | None:
    """Rollout success per RL iteration, against iterations and against environment steps so far."""
    plt = _pyplot()
    if plt is None or not history:
        return None
    its = [h["iteration"] for h in history]
    steps = [h["env_steps"] for h in history]
    success = [100 * h["success_rate"] for h in history]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2), sharey=True)
    try:
        left.plot(its, success, marker=".", color="#4c78a8")
        left.set_xlabel("iteration")
        left.set_ylabel("rollout success (%)")
        right.plot(steps, success, marker=".", color="#f58518")
        right.set_xlabel("environment steps")
        for ax in (left, right):
            ax.set_ylim(0, 100)
            ax.grid(alpha=0.3)
        fig.suptitle("RL rollouts (the tasks dynamic sampling drew, not the evaluation protocol)", fontsize=9)
        return _save(fig, path)
    finally:
        plt.close(fig)


def compared_curves(histories: dict[str, list[dict[str, Any]]], path: Path, title: str = "") -> Path | None:
    """Rollout success against environment steps, one line per labelled RL run (runs compared at equal steps)."""
    plt = _pyplot()
    if plt is None or not histories:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    try:
        for label, history in histories.items():
            ax.plot([h["env_steps"] for h in history], [100 * h["success_rate"] for h in history], marker=".",
                    label=label)
        ax.set_xlabel("environment steps")
        ax.set_ylabel("rollout success (%)")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(title, fontsize=9)
        return _save(fig, path)
    finally:
        plt.close(fig)
