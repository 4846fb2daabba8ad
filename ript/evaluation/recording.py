"""Episodes kept as demonstration files: ``ript eval record_episodes=true`` writes every episode it runs (each
step's observation and action, its success) to ``<out_dir>/episodes/<task>.hdf5`` in the layout of the task's
demos, so a world model can train on a policy's own rollouts, failures included (``data.extra_dirs``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ript.data.hdf5 import UPRIGHT_ATTR, Demo, merge_demo_files, write_demo_file


class EpisodeFiles:
    """The runner's sink: each finished episode to a file of its own, merged per task by ``finish``."""

    def __init__(self, folder: Path, metadata: dict, instructions: dict[str, str]):
        self.folder, self.metadata, self.instructions = Path(folder), metadata, instructions
        self.parts: dict[str, list[tuple[int, int, Path]]] = {}  # task -> (seed, index, its file)

    def __call__(self, episode: dict) -> None:
        steps, task = episode["steps"], episode["task"]
        n = len(steps["actions"])
        dones = np.zeros(n, dtype=np.uint8)
        dones[-1] = 1
        rewards = np.zeros(n, dtype=np.uint8)
        rewards[-1] = int(episode["success"])
        demo = Demo(actions=steps["actions"], obs=steps["obs"], rewards=rewards, dones=dones,
                    attrs={"success": bool(episode["success"]), "layout_seed": int(episode["seed"]),
                           "episode": int(episode["episode"])})
        path = self.folder / f".{task}.seed{episode['seed']}.episode{episode['episode']:05d}.hdf5"
        write_demo_file(path, [demo], self.file_attrs(task))
        self.parts.setdefault(task, []).append((int(episode["seed"]), int(episode["episode"]), path))

    def file_attrs(self, task: str) -> dict:
        return {"task_name": task, "instruction": self.instructions[task], "suite": self.metadata["suite"],
                "env_args": self.metadata["env_args"], UPRIGHT_ATTR: True, "source": "ript eval"}

    def finish(self) -> list[Path]:
        """One file per task (its episodes in seed and episode order); the per-episode files are removed."""
        out = []
        for task, parts in sorted(self.parts.items()):
            parts.sort()
            path = self.folder / f"{task}.hdf5"
            merge_demo_files([p for _, _, p in parts], path, self.file_attrs(task))
            for _, _, p in parts:
                p.unlink(missing_ok=True)
            out.append(path)
        return out
