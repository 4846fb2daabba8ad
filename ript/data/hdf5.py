"""Reading and writing demonstration files in the robomimic / LIBERO HDF5 layout.

    data (attrs: env_args JSON, task_name, instruction or problem_info JSON, total, ...)
    data/demo_<i>/actions        (T, A) float
    data/demo_<i>/obs/<key>      (T, ...) images uint8 (T, H, W, 3) or low-dim float
    data/demo_<i>/states         (T, S) full simulator state
    data/demo_<i>/rewards, dones (T,)

One reader serves both layouts; obs keys in a file are mapped to canonical keys by the task config.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ript.errors import RiptError
from ript.utils.atomic import atomic_replace


@dataclass
class Demo:
    actions: np.ndarray
    obs: dict[str, np.ndarray]
    states: np.ndarray | None = None
    rewards: np.ndarray | None = None
    dones: np.ndarray | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, np.ndarray] = field(default_factory=dict)  # further per-step arrays, e.g. robot_states


# Per-demo dataset of ript's own collections: the scripted expert's command before the collection's noise was
# added (``actions`` holds what was executed, as the official layout has it).
EXPERT_ACTIONS = "expert_actions"

# File attribute of ript's collections: the settings the demos were collected with (JSON), compared by a rerun.
COLLECTION_ATTR = "collection"

# File attribute of episodes recorded from the env's observations: their images are upright, so the task's
# ``flip_obs_keys`` (for files stored as robosuite renders) do not apply.
UPRIGHT_ATTR = "upright"


def _is_image_key(key: str) -> bool:
    return key.endswith("_rgb") or key.endswith("_image")


@contextlib.contextmanager
def _atomic_data_group(path: Path, attrs: dict[str, Any]) -> Iterator[h5py.Group]:
    """The ``data`` group of a temporary file beside ``path``; on success ``attrs`` are written to it and the
    file is renamed into place, so no half-written file ever carries the final name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with h5py.File(tmp, "w") as f:
            data = f.create_group("data")
            yield data
            for k, v in attrs.items():
                data.attrs[k] = json.dumps(v) if isinstance(v, (dict, list)) else v
        atomic_replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_demo_file(path: Path, demos: list[Demo], attrs: dict[str, Any]) -> None:
    """Write demos to ``path`` atomically."""
    with _atomic_data_group(path, attrs) as data:
        for i, demo in enumerate(demos):
            g = data.create_group(f"demo_{i}")
            g.create_dataset("actions", data=demo.actions)
            for key, value in demo.obs.items():
                if _is_image_key(key):
                    chunks = (1,) + value.shape[1:]
                    g.create_dataset(f"obs/{key}", data=value, chunks=chunks, compression="lzf")
                else:
                    g.create_dataset(f"obs/{key}", data=value)
            for name in ("states", "rewards", "dones"):
                value = getattr(demo, name)
                if value is not None:
                    g.create_dataset(name, data=value)
            for name, value in demo.extra.items():
                g.create_dataset(name, data=value)
            g.attrs["num_samples"] = len(demo.actions)
            for k, v in demo.attrs.items():
                g.attrs[k] = v
        data.attrs["total"] = sum(len(d.actions) for d in demos)


def merge_demo_files(parts: list[Path], path: Path, attrs: dict[str, Any]) -> list[dict[str, Any]]:
    """Concatenate the demos of ``parts`` into ``path`` (renumbered, chunks copied without recompressing),
    atomically. Returns each demo's attributes."""
    demo_attrs: list[dict[str, Any]] = []
    with _atomic_data_group(path, attrs) as data:
        for part in parts:
            with h5py.File(part, "r") as f:
                for name in sorted(f["data"], key=_demo_sort_key):
                    f.copy(f["data"][name], data, name=f"demo_{len(demo_attrs)}")
                    demo_attrs.append(dict(f["data"][name].attrs))
        data.attrs["total"] = sum(int(a["num_samples"]) for a in demo_attrs)
    return demo_attrs


def demo_names(data: h5py.Group) -> list[str]:
    """A file's ``demo_<i>`` groups in numeric order (demo_10 after demo_9)."""
    return sorted((n for n in data if n.startswith("demo_")), key=_demo_sort_key)


def _demo_sort_key(name: str) -> int:
    try:
        return int(name.split("_", 1)[1])
    except (IndexError, ValueError):
        return 1 << 30


def read_file_attrs(path: Path) -> dict[str, Any]:
    """The ``data`` group's attributes, JSON strings decoded."""
    path = Path(path)
    try:
        with h5py.File(path, "r") as f:
            if "data" not in f:
                raise RiptError(f"{path}: no 'data' group; not a robomimic/LIBERO demonstration file")
            out = {}
            for k, v in f["data"].attrs.items():
                if isinstance(v, bytes):
                    v = v.decode()
                if isinstance(v, str) and v[:1] in "[{":
                    try:
                        v = json.loads(v)
                    except json.JSONDecodeError:
                        pass
                elif isinstance(v, np.generic):
                    v = v.item()
                out[k] = v
            return out
    except FileNotFoundError:
        raise RiptError(f"dataset file {path} does not exist (run `ript collect` first?)") from None
    except OSError as e:
        raise RiptError(f"{path}: corrupt or truncated HDF5 file ({e})") from None


def instruction_from_attrs(attrs: dict[str, Any], path: Path) -> str:
    if "instruction" in attrs:
        return str(attrs["instruction"])
    info = attrs.get("problem_info")
    if isinstance(info, dict) and "language_instruction" in info:
        text = info["language_instruction"]
        return " ".join(text) if isinstance(text, list) else str(text)
    raise RiptError(f"{path}: data.attrs has neither 'instruction' nor 'problem_info.language_instruction'")


@contextlib.contextmanager
def _demo_file(path: Path) -> Iterator[h5py.File]:
    """A demonstration file open for reading; h5py's errors inside the block become one line naming it."""
    if not path.is_file():
        raise RiptError(f"dataset file {path} does not exist (run `ript collect` first?)")
    try:
        with h5py.File(path, "r") as f:
            yield f
    except RiptError:
        raise
    except (OSError, KeyError, ValueError) as e:
        raise RiptError(f"{path}: corrupt or truncated HDF5 file ({e})") from None


def _chosen_demos(f: h5py.File, path: Path, max_demos: int | None,
                  pick: Callable[[int], list[int]] | None) -> list[str]:
    """The demo groups a reader takes: the first ``max_demos``, then the positions ``pick`` chooses."""
    if "data" not in f:
        raise RiptError(f"{path}: no 'data' group; not a robomimic/LIBERO demonstration file")
    names = demo_names(f["data"])
    if not names:
        raise RiptError(f"{path}: 'data' holds no demo_<i> groups")
    names = names[:max_demos]
    return [names[i] for i in (range(len(names)) if pick is None else pick(len(names)))]


def _checked_shapes(g: h5py.Group, where: str, obs_keys: dict[str, str],
                    action_key: str = "actions") -> tuple[tuple[int, int], dict[str, h5py.Dataset]]:
    """A demo group's action labels' shape (T, action_dim) and its obs datasets by canonical key, checked
    without reading any values."""
    if action_key not in g:
        hint = " (only files `ript collect` wrote have it)" if action_key == EXPERT_ACTIONS else ""
        raise RiptError(f"{where}/{action_key} is missing{hint}")
    shape = g[action_key].shape
    if len(shape) != 2 or shape[0] == 0:
        raise RiptError(f"{where}/{action_key} has shape {shape}; expected (T, action_dim)")
    obs = {}
    for canonical, key in obs_keys.items():
        if f"obs/{key}" not in g:
            raise RiptError(f"{where}/obs/{key} is missing (mapped from obs key {canonical!r})")
        obs[canonical] = g[f"obs/{key}"]
    return (int(shape[0]), int(shape[1])), obs


@dataclass
class DemoLayout:
    """What a reader will take from a file, known without decompressing anything: the chosen demos, their
    lengths, and each canonical obs key's per-step shape and dtype (images uint8, the rest float32)."""
    path: Path
    names: list[str]
    lengths: list[int]
    action_dim: int
    obs: dict[str, tuple[tuple[int, ...], np.dtype]]
    successes: list[bool] = field(default_factory=list)  # each demo's ``success`` attribute (absent: a success)


def demo_layout(path: Path, obs_keys: dict[str, str], max_demos: int | None = None,
                pick: Callable[[int], list[int]] | None = None, action_key: str = "actions") -> DemoLayout:
    """The layout of the demos ``iter_demos`` yields with the same arguments (its shape checks too)."""
    path = Path(path)
    with _demo_file(path) as f:
        names = _chosen_demos(f, path, max_demos, pick)
        lengths, action_dim, obs, successes = [], 0, {}, []
        for name in names:
            (steps, action_dim), datasets = _checked_shapes(f["data"][name], f"{path}:data/{name}", obs_keys,
                                                            action_key)
            lengths.append(steps)
            successes.append(bool(f["data"][name].attrs.get("success", True)))  # official demos all succeed
            for canonical, d in datasets.items():
                dtype = np.dtype(np.uint8 if d.dtype == np.uint8 else np.float32)  # as iter_demos loads it
                obs.setdefault(canonical, (tuple(d.shape[1:]), dtype))
        return DemoLayout(path, names, lengths, action_dim, obs, successes)


def iter_demos(
    path: Path,
    obs_keys: dict[str, str],
    max_demos: int | None = None,
    action_dim: int | None = None,
    flip_keys: tuple[str, ...] = (),
    pick: Callable[[int], list[int]] | None = None,
    action_key: str = "actions",
) -> Iterator[Demo]:
    """The demos one at a time, file obs keys mapped onto canonical keys (``obs_keys``: canonical -> key in file).

    ``pick`` maps the number of demos to the positions to read, so a split reads only its own demos (the
    images are most of the file and decompressing them is most of the loading time). ``action_key`` names
    the dataset read as ``Demo.actions`` (``EXPERT_ACTIONS``: the noise-free labels of ript's collections).

    Every problem is reported as one line naming the file and the key.
    """
    path = Path(path)
    with _demo_file(path) as f:
        if f["data"].attrs.get(UPRIGHT_ATTR, False):
            flip_keys = ()  # recorded from the env's observations, which are upright already
        for name in _chosen_demos(f, path, max_demos, pick):
            g, where = f["data"][name], f"{path}:data/{name}"
            (steps, dim), datasets = _checked_shapes(g, where, obs_keys, action_key)
            if action_dim is not None and dim != action_dim:
                raise RiptError(f"{where}/{action_key} has action dim {dim} but the config expects {action_dim}")
            actions = np.asarray(g[action_key][()], dtype=np.float32)
            if not np.isfinite(actions).all():
                raise RiptError(f"{where}/{action_key} contains NaN or inf")
            obs = {}
            for canonical, d in datasets.items():
                value = d[()]
                if len(value) != steps:
                    raise RiptError(f"{where}/obs/{obs_keys[canonical]} has {len(value)} steps but {action_key} has "
                                    f"{steps}")
                if value.dtype != np.uint8:
                    value = value.astype(np.float32)
                    if not np.isfinite(value).all():
                        raise RiptError(f"{where}/obs/{obs_keys[canonical]} contains NaN or inf")
                if canonical in flip_keys:
                    value = np.ascontiguousarray(value[:, ::-1])
                obs[canonical] = value
            yield Demo(actions=actions, obs=obs, attrs=dict(g.attrs))


def read_demos(path: Path, obs_keys: dict[str, str], max_demos: int | None = None, action_dim: int | None = None,
               flip_keys: tuple[str, ...] = (), pick: Callable[[int], list[int]] | None = None,
               action_key: str = "actions") -> list[Demo]:
    """Every demo ``iter_demos`` yields with the same arguments."""
    return list(iter_demos(path, obs_keys, max_demos, action_dim, flip_keys, pick, action_key))
