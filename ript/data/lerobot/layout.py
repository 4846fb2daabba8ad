"""What a LeRobot v3.0 folder's layout names (paths, index features), the libraries that read and write it, and how
ript's HDF5 datasets map to its features."""

from __future__ import annotations

from typing import Any

import numpy as np

from ript.errors import RiptError

CODEBASE_VERSION = "v3.0"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_FILE = "meta/episodes/chunk-000/file-000.parquet"
INDEX_FEATURES = {name: {"dtype": "int64", "shape": [1], "names": None}
                  for name in ("frame_index", "episode_index", "index", "task_index")}
INDEX_FEATURES["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}


def libraries():
    try:
        import av
        import pandas as pd
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as e:
        raise RiptError(f"LeRobot datasets need pyarrow, pandas and PyAV ({e.name} is missing): "
                        f"pip install -e .[lerobot]") from None
    return av, pd, pa, pq


def feature_name(path: str, value: np.ndarray) -> str:
    """The LeRobot feature a demo's HDF5 dataset becomes (LeRobot's conventional names where there is one)."""
    if path == "actions":
        return "action"
    if path.startswith("obs/"):
        key = path[4:]
        return f"observation.images.{key}" if value.dtype == np.uint8 and value.ndim == 4 else f"observation.{key}"
    return {"rewards": "next.reward", "dones": "next.done", "states": "observation.environment_state"}.get(
        path, f"ript.{path}")


def jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def feature_stats(values: np.ndarray, image: bool) -> dict[str, list]:
    if image:  # LeRobot's image stats: per channel, in [0, 1], shaped (3, 1, 1)
        x = values.reshape(-1, 3).astype(np.float64) / 255.0
        shape = (3, 1, 1)
    else:
        x = values.reshape(len(values), -1).astype(np.float64)
        shape = x.shape[1:]
    out = {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0)}
    return {**{k: v.reshape(shape).tolist() for k, v in out.items()}, "count": [int(len(values))]}
