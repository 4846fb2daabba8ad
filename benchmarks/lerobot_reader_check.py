"""Opens a folder written by ``ript export`` with the ``lerobot`` package's own ``LeRobotDataset`` and compares
what it reads with the HDF5 files the folder came from.

lerobot 0.4.4 pins torch<2.11 and needs a torchvision that imports, so it runs in its own environment:

    python -m venv /tmp/lrvenv && /tmp/lrvenv/bin/pip install torch==2.9.1 torchvision==0.24.1 lerobot==0.4.4
    ript collect task=metaworld_quick task.demos_per_task=3 task.data_dir=/tmp/lr/data
    ript export task=metaworld_quick task.data_dir=/tmp/lr/data out=/tmp/lr/lerobot
    python -m benchmarks.lerobot_reader_check reference /tmp/lr/lerobot /tmp/lr/data /tmp/lr/ref.npz
    /tmp/lrvenv/bin/python benchmarks/lerobot_reader_check.py check /tmp/lr/lerobot /tmp/lr/ref.npz corner_rgb

``reference`` (ript's environment) gathers the source demos' actions and one camera's frames in the folder's
episode order; ``check`` (lerobot's) opens the folder with ``LeRobotDataset(root=...)`` (PyAV decoding: lerobot's
default torchcodec needs system FFmpeg libraries), and prints its episodes, features and tasks, whether the
actions are identical and the frames' error against the originals (AV1 at crf 30).
"""

from __future__ import annotations

import json
import sys

import numpy as np


def reference(folder: str, data_dir: str, out: str, camera: str = "corner_rgb") -> None:
    import h5py
    import pandas as pd

    episodes = pd.read_parquet(f"{folder}/meta/episodes/chunk-000/file-000.parquet")
    actions, frames, taken = [], [], {}
    for _, row in episodes.iterrows():
        name = row["ript/file"]
        k = taken[name] = taken.get(name, -1) + 1  # the export writes a file's demos in order
        with h5py.File(f"{data_dir}/{name}") as f:
            demo = f["data"][sorted(f["data"], key=lambda s: int(s.split("_")[1]))[k]]
            if json.loads(row["ript/attrs"])["layout_seed"] != demo.attrs["layout_seed"]:
                raise SystemExit(f"{name}: episode {row['episode_index']} is not demo {k}")
            actions.append(demo["actions"][:])
            frames.append(demo["obs"][camera][:])
    np.savez(out, actions=np.concatenate(actions), frames=np.concatenate(frames))
    print(f"{out}: {sum(len(a) for a in actions)} frames of {len(actions)} episodes")


def check(folder: str, ref_file: str, camera: str = "corner_rgb") -> None:
    import lerobot  # noqa: F401  (lerobot's environment)
    from lerobot.datasets.lerobot_dataset import LeRobotDataset, LeRobotDatasetMetadata

    meta = LeRobotDatasetMetadata("ript/export", root=folder)
    ds = LeRobotDataset("ript/export", root=folder, video_backend="pyav")
    print(f"LeRobotDataset: {ds.num_episodes} episodes, {ds.num_frames} frames, fps {ds.fps}")
    print("features:", ", ".join(sorted(ds.features)))
    print("tasks:", list(meta.tasks.index))
    ref = np.load(ref_file)
    key = f"observation.images.{camera}"
    actions = np.stack([ds[i]["action"].numpy() for i in range(len(ds))])
    frames = np.stack([(ds[i][key].numpy().transpose(1, 2, 0) * 255).round() for i in range(len(ds))])
    print("actions identical to the HDF5 files':", bool(np.array_equal(actions, ref["actions"])))
    err = np.abs(frames - ref["frames"].astype(np.float64))
    per_frame = err.reshape(len(err), -1).mean(1)
    print(f"{camera} through lerobot's decoder vs the originals: mean absolute error {err.mean():.2f} levels of 255 "
          f"(worst frame {per_frame.max():.2f}), 99th percentile {np.percentile(err, 99):.0f}")


if __name__ == "__main__":
    {"reference": reference, "check": check}[sys.argv[1]](*sys.argv[2:])
