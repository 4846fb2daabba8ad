"""Episodes kept as demonstration files: ``ript eval record_episodes=true`` writes every episode it runs (each
step's observation and action, its success) to ``<out_dir>/episodes/<task>.hdf5`` in the layout of the task's
demos, so a world model can train on a policy's own rollouts, failures included (``data.extra_dirs``)."""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ript.data.hdf5 import UPRIGHT_ATTR, Demo, merge_demo_files, write_demo_file
from ript.errors import RiptError

# episodes handed to the writer and not yet on disk: bounds the memory they hold (a LIBERO episode's frames at
# 128 px are ~17 MB) when the simulators outpace the writer
MAX_PENDING = 16


class EpisodeFiles:
    """The runner's sink: each finished episode to a file of its own, merged per task by ``finish``. The files are
    written on a thread of their own: compressing a LIBERO episode's frames takes ~0.2 s, which the driving process
    would otherwise spend while every env worker waits for its next decision (h5py's compression lets the driving
    thread run meanwhile)."""

    def __init__(self, folder: Path, metadata: dict, instructions: dict[str, str]):
        self.folder, self.metadata, self.instructions = Path(folder), metadata, instructions
        self.parts: dict[str, list[tuple[int, int, Path]]] = {}  # task -> (seed, index, its file)
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="episode-files")
        self.pending: deque[Future] = deque()

    def __call__(self, episode: dict) -> None:
        """Hand ``episode`` (its ``steps``: the observations before each action, the actions) to the writer."""
        task = episode["task"]
        path = self.folder / f".{task}.seed{episode['seed']}.episode{episode['episode']:05d}.hdf5"
        self.parts.setdefault(task, []).append((int(episode["seed"]), int(episode["episode"]), path))
        while self.pending and (len(self.pending) >= MAX_PENDING or self.pending[0].done()):
            self.pending.popleft().result()  # a failed write ends the run here, naming its file
        self.pending.append(self.writer.submit(self.write, path, episode))

    def write(self, path: Path, episode: dict) -> None:
        steps = episode["steps"]
        observations, actions = steps["obs"], steps["actions"]
        n = len(actions)
        dones = np.zeros(n, dtype=np.uint8)
        dones[-1] = 1
        rewards = np.zeros(n, dtype=np.uint8)
        rewards[-1] = int(episode["success"])
        demo = Demo(actions=np.stack(actions).astype(np.float32),
                    obs={k: np.stack([o[k] for o in observations]) for k in observations[0]},
                    rewards=rewards, dones=dones,
                    attrs={"success": bool(episode["success"]), "layout_seed": int(episode["seed"]),
                           "episode": int(episode["episode"])})
        try:
            write_demo_file(path, [demo], self.file_attrs(episode["task"]))
        except OSError as e:
            raise RiptError(f"{path}: the episode could not be written ({e})") from None

    def file_attrs(self, task: str) -> dict:
        return {"task_name": task, "instruction": self.instructions[task], "suite": self.metadata["suite"],
                "env_args": self.metadata["env_args"], UPRIGHT_ATTR: True, "source": "ript eval"}

    def finish(self) -> list[Path]:
        """Once every episode is written: one file per task (its episodes in seed and episode order); the
        per-episode files are removed."""
        while self.pending:
            self.pending.popleft().result()
        self.writer.shutdown()
        out = []
        for task, parts in sorted(self.parts.items()):
            parts.sort()
            path = self.folder / f"{task}.hdf5"
            merge_demo_files([p for _, _, p in parts], path, self.file_attrs(task))
            for _, _, p in parts:
                p.unlink(missing_ok=True)
            out.append(path)
        return out
