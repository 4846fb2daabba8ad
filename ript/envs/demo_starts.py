"""Imagined episodes that start along the demos (``environment.starts=demo_frames``) instead of at the
simulator's first frame: each (task, seed) names a real frame of one of that task's demos, and the episode goes on
in the world model for a few chunks (``environment.start_chunks``) from there. A world model is accurate over a
few chunks and drifts over a whole episode; starting from real frames anywhere in the task keeps every imagined
episode within the horizon it predicts well, as model-based RL's branched rollouts do.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from ript.data.hdf5 import DemoLayout, demo_layout, iter_demos
from ript.errors import RiptError


def start_frame(task: str, seed: int, length: int) -> int:
    """The frame an episode starts at, uniform over the demo but its last frame (nothing follows it), fixed by
    the task and the seed alone."""
    digest = hashlib.blake2b(f"{task}|{seed}|start".encode(), digest_size=8).digest()
    return int(int.from_bytes(digest, "little") / 2**64 * max(1, length - 1))


class DemoFrames:
    """Start observations read from the world model's demonstration files: episode (task, seed) starts at
    ``start_frame`` of demo ``seed % demos``; the same interface as ``InitialFrames`` (``ensure``, ``[key]``,
    ``close``)."""

    def __init__(self, files: dict[str, Path], obs_keys: dict[str, str], flip_keys: tuple[str, ...]):
        self.files, self.obs_keys, self.flip_keys = files, obs_keys, flip_keys
        self.frames: dict[tuple[str, int], dict[str, np.ndarray]] = {}
        self.layouts: dict[str, DemoLayout] = {}

    @classmethod
    def of_world_model(cls, config: dict, keys: list[str]) -> DemoFrames:
        """The files the world model trained on, read for the observations it predicts."""
        meta, task = config["metadata"], config["cfg"]["task"]
        files = {name: Path(f) for name, f in zip(meta["task_names"], meta["files"], strict=True)}
        missing = next((f for f in files.values() if not f.is_file()), None)
        if missing is not None:
            raise RiptError(f"environment.starts=demo_frames reads the world model's demos, and {missing} is not "
                            f"there (run from the folder it was trained in, or collect the suite's demos again)")
        obs_keys = {k: task["obs_keys"][k] for k in keys}
        return cls(files, obs_keys, tuple(task.get("flip_obs_keys") or ()))

    def __getitem__(self, key: tuple[str, int]) -> dict[str, np.ndarray]:
        return self.frames[key]

    def ensure(self, keys: list[tuple[str, int]]) -> None:
        """Read the start frames of ``keys`` not read yet, each demo once."""
        wanted: dict[tuple[str, int], list[int]] = {}
        for task, seed in sorted(set(keys) - set(self.frames)):
            wanted.setdefault((task, seed % len(self.layout(task).names)), []).append(seed)
        for (task, demo), seeds in wanted.items():
            (read,) = iter_demos(self.files[task], self.obs_keys, flip_keys=self.flip_keys, pick=lambda n, d=demo: [d])
            for seed in seeds:
                t = start_frame(task, seed, len(read.actions))
                self.frames[(task, seed)] = {k: np.ascontiguousarray(v[t]) for k, v in read.obs.items()}

    def layout(self, task: str) -> DemoLayout:
        if task not in self.files:
            raise RiptError(f"environment.starts=demo_frames: the world model has no demos of task {task}")
        if task not in self.layouts:
            self.layouts[task] = demo_layout(self.files[task], self.obs_keys)
        return self.layouts[task]

    def close(self) -> None:
        pass
