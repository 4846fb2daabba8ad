"""``ript export``: demos of HDF5 files as a LeRobot v3.0 folder (``ript.data.lerobot``)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ript.data.hdf5 import demo_names, instruction_from_attrs, read_file_attrs
from ript.data.lerobot.layout import (
    CODEBASE_VERSION,
    DATA_PATH,
    EPISODES_FILE,
    INDEX_FEATURES,
    VIDEO_PATH,
    feature_name,
    feature_stats,
    jsonable,
    libraries,
)
from ript.errors import RiptError
from ript.utils.atomic import atomic_write_text


def _read_demo(group: h5py.Group) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    group.visititems(lambda name, obj: arrays.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return arrays


def _demos(path: Path) -> Iterator[tuple[dict[str, np.ndarray], dict[str, Any]]]:
    with h5py.File(path, "r") as f:
        for name in demo_names(f["data"]):
            g = f["data"][name]
            yield _read_demo(g), {k: jsonable(v) for k, v in g.attrs.items()}


class _VideoWriter:
    def __init__(self, av, path: Path, fps: int, size: tuple[int, int], codec: str, crf: int):
        path.parent.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("SVT_LOG", "1")  # the AV1 encoder prints its whole configuration at info level
        self.container = av.open(str(path), "w")
        self.stream = self.container.add_stream(codec, rate=fps)
        self.stream.height, self.stream.width = size
        self.stream.pix_fmt = "yuv420p"
        self.stream.options = {"crf": str(crf), "g": "2"}  # a key frame every 2 frames: fast random access
        if codec == "libsvtav1":  # one encoder thread: on a loaded host its threads have handed the muxer a packet
            self.stream.options["svtav1-params"] = "lp=1"  # it refused (EINVAL), once in a few test runs
        self.av, self.fps, self.frames = av, fps, 0

    def add(self, frames: np.ndarray) -> None:
        for frame in frames:
            video_frame = self.av.VideoFrame.from_ndarray(frame, format="rgb24")
            # each frame's timestamp given (its index at fps), not inferred: a muxer refuses a non-increasing one
            video_frame.pts, video_frame.time_base = self.frames, Fraction(1, self.fps)
            self.frames += 1
            for packet in self.stream.encode(video_frame):
                self.container.mux(packet)

    def close(self) -> None:
        for packet in self.stream.encode():
            self.container.mux(packet)
        self.container.close()


def export_lerobot(files: list[Path], out: Path, fps: int, codec: str = "libsvtav1", crf: int = 30,
                   robot_type: str | None = None) -> dict[str, Any]:
    """Write the demos of ``files`` (one HDF5 file per task, in order) as a LeRobot v3.0 folder ``out``,
    built beside it and renamed into place. Returns the ``info.json`` written."""
    av, pd, pa, pq = libraries()
    out = Path(out)
    if out.exists():
        raise RiptError(f"{out} exists; export writes a new folder (remove it or choose another out=)")
    if not files:
        raise RiptError("export: no demonstration files given")
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        writer = FolderWriter(av, tmp, fps, codec, crf)
        for path in files:
            writer.add_file(Path(path))
        info = writer.finish(pd, pa, pq, robot_type)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return info


class FolderWriter:
    """A LeRobot folder's tables, videos and metadata, filled one source file at a time (``add_file``: its demos in
    order, checked against the first file's datasets) and written by ``finish``."""

    def __init__(self, av, root: Path, fps: int, codec: str, crf: int):
        self.av, self.root, self.fps, self.codec, self.crf = av, root, fps, codec, crf
        self.tasks: dict[str, int] = {}
        self.columns: dict[str, list] = {}
        self.features: dict[str, dict] = {}
        self.sources: dict[str, str] = {}  # feature -> the HDF5 dataset it came from
        self.videos: dict[str, _VideoWriter] = {}
        self.episodes: list[dict[str, Any]] = []
        self.image_samples: dict[str, list[np.ndarray]] = {}
        self.file_attrs: list[dict] = []
        self.frame = 0

    def add_file(self, path: Path) -> None:
        attrs = read_file_attrs(path)
        self.file_attrs.append({"file": path.name, "attrs": {k: jsonable(v) for k, v in attrs.items()}})
        task = instruction_from_attrs(attrs, path)
        task_index = self.tasks.setdefault(task, len(self.tasks))
        for arrays, demo_attrs in _demos(path):
            self.add_demo(path, arrays, demo_attrs, task, task_index)

    def add_demo(self, path: Path, arrays: dict[str, np.ndarray], demo_attrs: dict, task: str,
                 task_index: int) -> None:
        length = len(arrays["actions"])
        ep: dict[str, Any] = {"episode_index": len(self.episodes), "tasks": [task], "length": length,
                              "data/chunk_index": 0, "data/file_index": 0, "dataset_from_index": self.frame,
                              "dataset_to_index": self.frame + length, "meta/episodes/chunk_index": 0,
                              "meta/episodes/file_index": 0, "ript/file": path.name,
                              "ript/attrs": json.dumps(demo_attrs)}
        if self.episodes and set(arrays) != set(self.sources.values()):
            raise RiptError(f"{path}: its demos hold {sorted(arrays)}, the first file's "
                            f"{sorted(self.sources.values())}")
        for dpath, value in sorted(arrays.items()):
            name = feature_name(dpath, value)
            if len(value) != length:
                raise RiptError(f"{path}: {dpath} has {len(value)} steps but actions has {length}")
            if self.sources.setdefault(name, dpath) != dpath or (name in self.features and (
                    self.features[name]["dtype"] != str(value.dtype) and self.features[name]["dtype"] != "video")):
                raise RiptError(f"{path}: {dpath} does not match the first file's datasets")
            if name.startswith("observation.images."):
                self.add_frames(name, value, ep)
                continue
            self.features.setdefault(name, {"dtype": str(value.dtype), "shape": list(value.shape[1:]) or [1],
                                            "names": None})
            self.columns.setdefault(name, []).append(value)
        steps = np.arange(length)
        for name, value in (("timestamp", (steps / self.fps).astype(np.float32)), ("frame_index", steps),
                            ("episode_index", np.full(length, len(self.episodes))), ("index", self.frame + steps),
                            ("task_index", np.full(length, task_index))):
            self.columns.setdefault(name, []).append(value.astype(INDEX_FEATURES[name]["dtype"]))
        self.episodes.append(ep)
        self.frame += length

    def add_frames(self, name: str, value: np.ndarray, ep: dict[str, Any]) -> None:
        """One camera's frames of an episode, onto the end of its video (opened with the first)."""
        fps, length = self.fps, len(value)
        if name not in self.videos:
            self.features[name] = {"dtype": "video", "shape": list(value.shape[1:]),
                                   "names": ["height", "width", "channels"],
                                   "info": {"video.fps": fps, "video.codec": self.codec, "video.pix_fmt": "yuv420p",
                                            "video.is_depth_map": False, "has_audio": False,
                                            "video.height": int(value.shape[1]), "video.width": int(value.shape[2]),
                                            "video.channels": 3}}
            self.videos[name] = _VideoWriter(self.av, self.root / VIDEO_PATH.format(video_key=name, chunk_index=0,
                                                                                    file_index=0),
                                             fps, value.shape[1:3], self.codec, self.crf)
        self.videos[name].add(value)
        self.image_samples.setdefault(name, []).append(value[:: max(1, length // 8)])
        ep.update({f"videos/{name}/chunk_index": 0, f"videos/{name}/file_index": 0,
                   f"videos/{name}/from_timestamp": self.frame / fps,
                   f"videos/{name}/to_timestamp": (self.frame + length) / fps})

    def finish(self, pd, pa, pq, robot_type: str | None) -> dict[str, Any]:
        """The videos closed, the data and episode tables, the tasks, ``info.json`` and ``stats.json`` written:
        the info."""
        root, episodes = self.root, self.episodes
        for writer in self.videos.values():
            writer.close()
        table, stats = {}, {}
        for name, parts in self.columns.items():
            value = _padded(name, parts, episodes, self.features)
            stats[name] = feature_stats(value, image=False)
            table[name] = pa.array(list(value)) if value.ndim > 1 else pa.array(value)
        for name, samples in self.image_samples.items():
            stats[name] = feature_stats(np.concatenate(samples), image=True)
        data_file = root / DATA_PATH.format(chunk_index=0, file_index=0)
        data_file.parent.mkdir(parents=True)
        pq.write_table(pa.table(table), data_file)
        (root / EPISODES_FILE).parent.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(episodes), root / EPISODES_FILE)
        pd.DataFrame({"task_index": list(self.tasks.values())},
                     index=pd.Index(list(self.tasks), name="task")).to_parquet(root / "meta" / "tasks.parquet")
        info = {"codebase_version": CODEBASE_VERSION, "robot_type": robot_type, "total_episodes": len(episodes),
                "total_frames": self.frame, "total_tasks": len(self.tasks), "chunks_size": 1000,
                "data_files_size_in_mb": 100, "video_files_size_in_mb": 200, "fps": self.fps,
                "splits": {"train": f"0:{len(episodes)}"}, "data_path": DATA_PATH,
                "video_path": VIDEO_PATH if self.videos else None, "features": {**self.features, **INDEX_FEATURES},
                "ript": {"files": self.file_attrs, "hdf5_datasets": self.sources}}
        atomic_write_text(root / "meta" / "info.json", json.dumps(info, indent=2))
        atomic_write_text(root / "meta" / "stats.json", json.dumps(stats, indent=2))
        return info


def _padded(name: str, parts: list[np.ndarray], episodes: list[dict], features: dict) -> np.ndarray:
    """One column from every episode's values. A vector whose length differs between tasks (MetaWorld's full
    simulator state) is zero-padded to the longest, and each episode's own length kept (``ript/dims/<name>``)."""
    widths = {p.shape[1:] for p in parts}
    if len(widths) == 1:
        return np.concatenate(parts)
    if any(p.ndim != 2 for p in parts):
        raise RiptError(f"export: {name} has shapes {sorted(widths)} in different episodes")
    width = max(p.shape[1] for p in parts)
    features[name]["shape"] = [width]
    for ep, p in zip(episodes, parts):
        ep[f"ript/dims/{name}"] = p.shape[1]
    return np.concatenate([np.pad(p, ((0, 0), (0, width - p.shape[1]))) for p in parts])
