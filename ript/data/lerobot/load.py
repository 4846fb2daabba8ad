"""``ript import`` and ``task.format=lerobot``: a LeRobot v3.0 folder's demos as HDF5 files (``ript.data.lerobot``)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ript.data.hdf5 import Demo, write_demo_file
from ript.data.lerobot.layout import CODEBASE_VERSION, EPISODES_FILE, INDEX_FEATURES, libraries
from ript.errors import RiptError


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
    av, pd, pa, pq = libraries()
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
