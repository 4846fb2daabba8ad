"""Demonstrations in LeRobotDataset v3.0 layout, out and back: ``ript export`` / ``ript import``.

    meta/info.json                                    codebase_version v3.0, fps, features, paths; ``ript``: what
                                                      the HDF5 files held that LeRobot has no field for
    meta/stats.json                                   per feature: min, max, mean, std, count
    meta/tasks.parquet                                task string (index) -> task_index
    meta/episodes/chunk-000/file-000.parquet          per episode: length, tasks, where its rows and frames are
    data/chunk-000/file-000.parquet                   one row per step: action, observation.*, indices, timestamp
    videos/observation.images.<camera>/chunk-000/file-000.mp4   every episode's frames, one after another

One data file and one video per camera (LeRobot splits at 100 / 200 MB; its reader takes either). Actions,
states and low-dim observations are stored as they are (lossless); images go through the video codec
(LeRobot's default, AV1 at crf 30, unless asked otherwise), so they come back within the codec's tolerance.
Written with pyarrow, pandas and PyAV (``pip install -e .[lerobot]``): the ``lerobot`` package itself pins an
older torch than this project's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ript.data.hdf5 import Demo, demo_names, instruction_from_attrs, read_file_attrs, write_demo_file
from ript.errors import RiptError
from ript.utils.atomic import atomic_write_text

CODEBASE_VERSION = "v3.0"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_FILE = "meta/episodes/chunk-000/file-000.parquet"
INDEX_FEATURES = {name: {"dtype": "int64", "shape": [1], "names": None}
                  for name in ("frame_index", "episode_index", "index", "task_index")}
INDEX_FEATURES["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}


def _libraries():
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


def _read_demo(group: h5py.Group) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    group.visititems(lambda name, obj: arrays.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return arrays


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def _demos(path: Path) -> Iterator[tuple[dict[str, np.ndarray], dict[str, Any]]]:
    with h5py.File(path, "r") as f:
        for name in demo_names(f["data"]):
            g = f["data"][name]
            yield _read_demo(g), {k: _jsonable(v) for k, v in g.attrs.items()}


class _VideoWriter:
    def __init__(self, av, path: Path, fps: int, size: tuple[int, int], codec: str, crf: int):
        path.parent.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("SVT_LOG", "1")  # the AV1 encoder prints its whole configuration at info level
        self.container = av.open(str(path), "w")
        self.stream = self.container.add_stream(codec, rate=fps)
        self.stream.height, self.stream.width = size
        self.stream.pix_fmt = "yuv420p"
        self.stream.options = {"crf": str(crf), "g": "2"}  # a key frame every 2 frames: fast random access
        self.av = av

    def add(self, frames: np.ndarray) -> None:
        for frame in frames:
            for packet in self.stream.encode(self.av.VideoFrame.from_ndarray(frame, format="rgb24")):
                self.container.mux(packet)

    def close(self) -> None:
        for packet in self.stream.encode():
            self.container.mux(packet)
        self.container.close()


def _stats(values: np.ndarray, image: bool) -> dict[str, list]:
    if image:  # LeRobot's image stats: per channel, in [0, 1], shaped (3, 1, 1)
        x = values.reshape(-1, 3).astype(np.float64) / 255.0
        shape = (3, 1, 1)
    else:
        x = values.reshape(len(values), -1).astype(np.float64)
        shape = x.shape[1:]
    out = {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0)}
    return {**{k: v.reshape(shape).tolist() for k, v in out.items()}, "count": [int(len(values))]}


def export_lerobot(files: list[Path], out: Path, fps: int, codec: str = "libsvtav1", crf: int = 30,
                   robot_type: str | None = None) -> dict[str, Any]:
    """Write the demos of ``files`` (one HDF5 file per task, in order) as a LeRobot v3.0 folder ``out``,
    built beside it and renamed into place. Returns the ``info.json`` written."""
    av, pd, pa, pq = _libraries()
    out = Path(out)
    if out.exists():
        raise RiptError(f"{out} exists; export writes a new folder (remove it or choose another out=)")
    if not files:
        raise RiptError("export: no demonstration files given")
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        info = _write_folder(av, pd, pa, pq, [Path(f) for f in files], tmp, fps, codec, crf, robot_type)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return info


def _write_folder(av, pd, pa, pq, files, root: Path, fps, codec, crf, robot_type) -> dict[str, Any]:
    tasks: dict[str, int] = {}
    columns: dict[str, list] = {}
    features: dict[str, dict] = {}
    sources: dict[str, str] = {}  # feature -> the HDF5 dataset it came from
    videos: dict[str, _VideoWriter] = {}
    episodes: list[dict[str, Any]] = []
    image_samples: dict[str, list[np.ndarray]] = {}
    file_attrs = []
    frame = 0
    for path in files:
        attrs = read_file_attrs(path)
        file_attrs.append({"file": path.name, "attrs": {k: _jsonable(v) for k, v in attrs.items()}})
        task = instruction_from_attrs(attrs, path)
        task_index = tasks.setdefault(task, len(tasks))
        for arrays, demo_attrs in _demos(path):
            length = len(arrays["actions"])
            ep: dict[str, Any] = {"episode_index": len(episodes), "tasks": [task], "length": length,
                                  "data/chunk_index": 0, "data/file_index": 0, "dataset_from_index": frame,
                                  "dataset_to_index": frame + length, "meta/episodes/chunk_index": 0,
                                  "meta/episodes/file_index": 0, "ript/file": path.name,
                                  "ript/attrs": json.dumps(demo_attrs)}
            if episodes and set(arrays) != set(sources.values()):
                raise RiptError(f"{path}: its demos hold {sorted(arrays)}, the first file's {sorted(sources.values())}")
            for dpath, value in sorted(arrays.items()):
                name = feature_name(dpath, value)
                if len(value) != length:
                    raise RiptError(f"{path}: {dpath} has {len(value)} steps but actions has {length}")
                if sources.setdefault(name, dpath) != dpath or (name in features and (
                        features[name]["dtype"] != str(value.dtype) and features[name]["dtype"] != "video")):
                    raise RiptError(f"{path}: {dpath} does not match the first file's datasets")
                if name.startswith("observation.images."):
                    if name not in videos:
                        features[name] = {"dtype": "video", "shape": list(value.shape[1:]),
                                          "names": ["height", "width", "channels"],
                                          "info": {"video.fps": fps, "video.codec": codec, "video.pix_fmt": "yuv420p",
                                                   "video.is_depth_map": False, "has_audio": False,
                                                   "video.height": int(value.shape[1]),
                                                   "video.width": int(value.shape[2]), "video.channels": 3}}
                        videos[name] = _VideoWriter(av, root / VIDEO_PATH.format(video_key=name, chunk_index=0,
                                                                                  file_index=0),
                                                    fps, value.shape[1:3], codec, crf)
                    videos[name].add(value)
                    image_samples.setdefault(name, []).append(value[:: max(1, length // 8)])
                    ep.update({f"videos/{name}/chunk_index": 0, f"videos/{name}/file_index": 0,
                               f"videos/{name}/from_timestamp": frame / fps,
                               f"videos/{name}/to_timestamp": (frame + length) / fps})
                    continue
                features.setdefault(name, {"dtype": str(value.dtype), "shape": list(value.shape[1:]) or [1],
                                           "names": None})
                columns.setdefault(name, []).append(value)
            steps = np.arange(length)
            for name, value in (("timestamp", (steps / fps).astype(np.float32)), ("frame_index", steps),
                                ("episode_index", np.full(length, len(episodes))), ("index", frame + steps),
                                ("task_index", np.full(length, task_index))):
                columns.setdefault(name, []).append(value.astype(INDEX_FEATURES[name]["dtype"]))
            episodes.append(ep)
            frame += length
    for writer in videos.values():
        writer.close()

    table, stats = {}, {}
    for name, parts in columns.items():
        value = _padded(name, parts, episodes, features)
        stats[name] = _stats(value, image=False)
        table[name] = pa.array(list(value)) if value.ndim > 1 else pa.array(value)
    for name, samples in image_samples.items():
        stats[name] = _stats(np.concatenate(samples), image=True)
    data_file = root / DATA_PATH.format(chunk_index=0, file_index=0)
    data_file.parent.mkdir(parents=True)
    pq.write_table(pa.table(table), data_file)
    (root / EPISODES_FILE).parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(episodes), root / EPISODES_FILE)
    pd.DataFrame({"task_index": list(tasks.values())}, index=pd.Index(list(tasks), name="task")).to_parquet(
        root / "meta" / "tasks.parquet")
    info = {"codebase_version": CODEBASE_VERSION, "robot_type": robot_type, "total_episodes": len(episodes),
            "total_frames": frame, "total_tasks": len(tasks), "chunks_size": 1000, "data_files_size_in_mb": 100,
            "video_files_size_in_mb": 200, "fps": fps, "splits": {"train": f"0:{len(episodes)}"},
            "data_path": DATA_PATH, "video_path": VIDEO_PATH if videos else None,
            "features": {**features, **INDEX_FEATURES},
            "ript": {"files": file_attrs, "hdf5_datasets": sources}}
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


def _decoded_frames(av, path: Path) -> Iterator[np.ndarray]:
    """The frames of one video, then a one-line error if it ends early or cannot be decoded (a truncated copy)."""
    try:
        with av.open(str(path)) as container:
            for frame in container.decode(video=0):
                yield frame.to_ndarray(format="rgb24")
    except (av.error.FFmpegError, OSError) as e:
        raise RiptError(f"{path}: cannot decode the video ({e}); the folder is damaged or incomplete: "
                        f"copy it again") from None
    raise RiptError(f"{path}: the video ends before its last episode's frames (truncated?); copy the folder again")


def _read_info(root: Path) -> dict[str, Any]:
    """``meta/info.json``, checked for what the import reads: the version, fps, features and the video path."""
    info_path = root / "meta" / "info.json"
    try:
        info = json.loads(info_path.read_text())
    except FileNotFoundError:
        raise RiptError(f"{info_path} does not exist; not a LeRobot dataset folder") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RiptError(f"{info_path}: not valid JSON ({e})") from None
    if not isinstance(info, dict):
        raise RiptError(f"{info_path} holds a {type(info).__name__}, not LeRobot's info object")
    if info.get("codebase_version") != CODEBASE_VERSION:
        raise RiptError(f"{info_path}: codebase_version {info.get('codebase_version')!r}; only {CODEBASE_VERSION} "
                        f"is read (convert older datasets with lerobot's own converter)")
    features = info.get("features")
    if not isinstance(features, dict) or not all(isinstance(f, dict) and "dtype" in f for f in features.values()):
        raise RiptError(f"{info_path}: 'features' is missing or not an object of features with a dtype each")
    if "action" not in features or not isinstance(info.get("fps"), (int, float)) or not isinstance(
            info.get("video_path", ""), str):
        raise RiptError(f"{info_path}: no 'action' feature, numeric 'fps' or 'video_path'; not a demonstration dataset")
    return info


def _read_parquet(pq, pa, path: Path):
    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise RiptError(f"{path}: unreadable parquet ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
                        f"the folder is damaged or half-written: copy it again") from None


def _episode_rows(ep: dict, path: Path, rows: int) -> tuple[int, int]:
    """An episode's rows in the data table, checked against the table's length."""
    try:
        lo, hi = int(ep["dataset_from_index"]), int(ep["dataset_to_index"])
    except (KeyError, TypeError, ValueError):
        raise RiptError(f"{path}: an episode without dataset_from_index / dataset_to_index") from None
    if not 0 <= lo < hi <= rows:
        raise RiptError(f"{path}: episode {ep.get('episode_index')} covers rows {lo}..{hi} of a data table of "
                        f"{rows} rows; the folder is damaged or half-written")
    return lo, hi


def import_lerobot(root: Path, data_dir: Path) -> list[Path]:
    """The HDF5 files (one per source file, or per task for a folder ript did not write) of the LeRobot v3.0
    folder ``root``, written into ``data_dir``; an existing file there is never replaced."""
    av, pd, pa, pq = _libraries()
    root, data_dir = Path(root), Path(data_dir)
    info = _read_info(root)
    ript_info = info.get("ript", {})
    sources = ript_info.get("hdf5_datasets") or {}
    episodes = _read_parquet(pq, pa, root / "meta" / "episodes").to_pylist()
    data = _read_parquet(pq, pa, root / "data")
    missing = [n for n, f in info["features"].items() if f["dtype"] != "video" and n not in data.column_names]
    if missing:
        raise RiptError(f"{root / 'data'}: no column {missing[0]!r}, which meta/info.json lists as a feature")
    fps = float(info["fps"])
    video_keys = [k for k, f in info["features"].items() if f["dtype"] == "video"]
    frames = {k: _decoded_frames(av, root / info["video_path"].format(video_key=k, chunk_index=0, file_index=0))
              for k in video_keys}
    columns = {name: data.column(name).to_numpy(zero_copy_only=False) for name in data.column_names}
    files = {f["file"]: f["attrs"] for f in ript_info.get("files", [])}
    grouped: dict[str, list[Demo]] = {}
    task_of: dict[str, str] = {}
    for ep in sorted(episodes, key=lambda e: e["episode_index"]):
        lo, hi = _episode_rows(ep, root / EPISODES_FILE, data.num_rows)
        arrays: dict[str, np.ndarray] = {}
        for name, feature in info["features"].items():
            if name in INDEX_FEATURES:
                continue
            if feature["dtype"] == "video":
                if round(ep[f"videos/{name}/from_timestamp"] * fps) != lo:
                    raise RiptError(f"{root}: episode {ep['episode_index']}'s frames are not stored in episode order")
                value = np.stack([next(frames[name]) for _ in range(hi - lo)])
            else:
                rows = columns[name][lo:hi]
                value = (np.stack(rows) if rows.dtype == object else rows).astype(feature["dtype"])
                if ep.get(f"ript/dims/{name}") is not None:
                    value = value[:, : ep[f"ript/dims/{name}"]]
            arrays[sources.get(name, _default_hdf5_name(name))] = value
        demo = Demo(actions=arrays.pop("actions"),
                    obs={k[4:]: arrays.pop(k) for k in list(arrays) if k.startswith("obs/")},
                    states=arrays.pop("states", None), rewards=arrays.pop("rewards", None),
                    dones=arrays.pop("dones", None), attrs=json.loads(ep.get("ript/attrs") or "{}"), extra=arrays)
        name = ep.get("ript/file") or f"{ep['tasks'][0]}.hdf5"
        grouped.setdefault(name, []).append(demo)
        task_of[name] = ep["tasks"][0]
    targets = [data_dir / name for name in grouped]
    clash = next((p for p in targets if p.exists()), None)
    if clash is not None:
        raise RiptError(f"{clash} exists; import never replaces a file (choose another data_dir=)")
    written = []
    for name, demos in grouped.items():
        write_demo_file(data_dir / name, demos, files.get(name) or {"instruction": task_of[name]})
        written.append(data_dir / name)
    return written


def decoded_folder(root: Path) -> Path:
    """The HDF5 files of LeRobot folder ``root`` for training (``task.format=lerobot``): imported once into
    ``<root>/.ript_hdf5-<hash of what it decodes>/`` (built beside it and renamed into place), then read from
    there like any collected data; a dataset whose metadata, tables or videos changed gets a new folder."""
    info = Path(root) / "meta" / "info.json"
    if not info.is_file():
        raise RiptError(f"{info} does not exist; task.format=lerobot needs a LeRobot v3.0 folder as task.data_dir")
    cache = Path(root) / f".ript_hdf5-{content_hash(Path(root))}"
    if cache.is_dir():
        return cache
    tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        import_lerobot(root, tmp)
        tmp.rename(cache)
    except OSError:
        if not cache.is_dir():  # not another process's finished copy (torchrun ranks decode side by side)
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return cache


def content_hash(root: Path) -> str:
    """A hash of every file the import reads (``meta/``, ``data/``, ``videos/``: names and bytes), so a decoded
    copy is never reused for a folder whose videos or tables were replaced under the same info.json. Reading
    the files costs about a second per GB, a small part of decoding them."""
    digest = hashlib.sha256()
    for part in ("meta", "data", "videos"):
        for path in sorted(p for p in (root / part).rglob("*") if p.is_file()):
            digest.update(f"{path.relative_to(root).as_posix()}\0{path.stat().st_size}\0".encode())
            with path.open("rb") as f:
                while chunk := f.read(1 << 22):
                    digest.update(chunk)
    return digest.hexdigest()[:16]


def _default_hdf5_name(feature: str) -> str:
    """Where a feature of a folder ript did not write goes in the HDF5 layout."""
    if feature == "action":
        return "actions"
    if feature.startswith("observation.images."):
        return f"obs/{feature.removeprefix('observation.images.')}_rgb"
    if feature.startswith("observation."):
        return f"obs/{feature.removeprefix('observation.')}"
    return {"next.reward": "rewards", "next.done": "dones"}.get(feature, feature.replace(".", "_"))
