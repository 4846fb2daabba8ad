"""RL's rollout record, one entry per iteration and task (``<run_dir>/rl_history.json``), and its picture
(``<run_dir>/rl_success.png``: rollout success against iterations and against environment steps). The steps
are those of the episodes that count, not of episodes an iteration cancelled, so a resumed run's record
equals an uninterrupted one's."""

from __future__ import annotations

import json
from pathlib import Path

from ript.errors import RiptError
from ript.utils.atomic import atomic_write_text
from ript.utils.plots import rl_curves


def read_history(path: Path) -> list[dict]:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise RiptError(f"{path}: not valid JSON ({e}); delete it to start the record afresh") from None


def recorded_env_steps(run_dir: Path) -> int:
    """The env steps an RL run in ``run_dir`` has counted so far (0 before its first iteration)."""
    path = Path(run_dir) / "rl_history.json"
    entries = read_history(path) if path.is_file() else []
    return int(entries[-1]["env_steps"]) if entries else 0


# what each entry keeps of its iteration's update (ript/rl/update.py's statistics), where measured
UPDATE_RECORD = ("approx_kl", "clip_fraction", "eval_action_shift", "optimizer_steps", "demo_loss")


class RolloutHistory:
    def __init__(self, run_dir: Path, start_iteration: int):
        self.path = Path(run_dir) / "rl_history.json"
        self.picture = Path(run_dir) / "rl_success.png"
        self.entries: list[dict] = []
        if start_iteration and self.path.is_file():
            # an iteration logged after the checkpoint resumed from (a crash in between) is run again
            self.entries = [e for e in read_history(self.path) if e["iteration"] <= start_iteration]

    def add(self, iteration: int, episodes: int, successes: int, env_steps: int,
            per_task: dict[str, tuple[int, int]] | None = None, update: dict[str, float] | None = None) -> None:
        """One iteration's counted episodes over all ranks; ``per_task``: each task's (episodes, successes);
        ``update``: the update's statistics named in ``UPDATE_RECORD``."""
        so_far = self.entries[-1]["env_steps"] if self.entries else 0
        self.entries.append({"iteration": iteration, "episodes": episodes, "success_rate": successes / max(1, episodes),
                             "env_steps": so_far + env_steps,
                             "per_task": {t: {"episodes": n, "successes": k}
                                          for t, (n, k) in (per_task or {}).items()},
                             **({"update": update} if update else {})})
        atomic_write_text(self.path, json.dumps(self.entries, indent=1))
        rl_curves(self.entries, self.picture)
