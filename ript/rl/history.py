"""RL's rollout record, one entry per iteration (``<run_dir>/rl_history.json``), and its picture
(``<run_dir>/rl_success.png``: rollout success against iterations and against environment steps). The steps
are those of the episodes that count, not of episodes a sampling round cancelled, so a resumed run's record
equals an uninterrupted one's."""

from __future__ import annotations

import json
from pathlib import Path

from ript.errors import RiptError
from ript.utils.atomic import atomic_write_text
from ript.utils.plots import rl_curves


class RolloutHistory:
    def __init__(self, run_dir: Path, start_iteration: int):
        self.path = Path(run_dir) / "rl_history.json"
        self.picture = Path(run_dir) / "rl_success.png"
        self.entries: list[dict] = []
        if start_iteration and self.path.is_file():
            try:
                entries = json.loads(self.path.read_text())
            except json.JSONDecodeError as e:
                raise RiptError(f"{self.path}: not valid JSON ({e}); delete it to start the record afresh") from None
            # an iteration logged after the checkpoint resumed from (a crash in between) is run again
            self.entries = [e for e in entries if e["iteration"] <= start_iteration]

    def add(self, iteration: int, episodes: int, successes: int, env_steps: int) -> None:
        so_far = self.entries[-1]["env_steps"] if self.entries else 0
        self.entries.append({"iteration": iteration, "episodes": episodes, "success_rate": successes / max(1, episodes),
                             "env_steps": so_far + env_steps})
        atomic_write_text(self.path, json.dumps(self.entries, indent=1))
        rl_curves(self.entries, self.picture)
