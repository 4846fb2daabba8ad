"""Hydra config composition for the CLI and the stage functions (no @hydra.main: the CLI owns argv)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ript.errors import RiptError
from ript.utils.containers import to_dict
from ript.utils.device import resolve_device

# the stages take the config helpers from here, including the two that live in ript.utils
__all__ = ["CONFIG_DIR", "compose", "data_files", "resolve_device", "task_names", "to_dict"]

CONFIG_DIR = Path(os.environ.get("RIPT_CONFIG_DIR", Path(__file__).resolve().parent.parent / "configs"))


def compose(name: str, overrides: list[str] | None = None) -> DictConfig:
    """Compose ``configs/<name>.yaml`` with hydra overrides; config errors become one-line RiptErrors."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if not (CONFIG_DIR / f"{name}.yaml").is_file():
        raise RiptError(f"config {CONFIG_DIR / (name + '.yaml')} not found (set RIPT_CONFIG_DIR?)")
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = hydra_compose(config_name=name, overrides=list(overrides or []))
        OmegaConf.resolve(cfg)
    except (HydraException, OmegaConfBaseException) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RiptError(f"config {name}.yaml: {first}") from None
    from ript.config_schema import validate

    validate(name, to_dict(cfg))
    return cfg


def override(key: str, value) -> str:
    """``key=value`` as hydra reads it back: a plain ASCII path or name as it is (so the overrides a protocol
    records stay as they were), anything else quoted, with non-ASCII characters kept as they are (hydra's
    unquoted grammar refuses them, and reads JSON's ``\\u`` escapes literally)."""
    text = str(value)
    if re.fullmatch(r"[A-Za-z0-9_./:+-]*", text) and text:
        return f"{key}={text}"
    return f"{key}={json.dumps(text, ensure_ascii=False)}"


def task_names(task_cfg: DictConfig) -> list[str]:
    """The task list: explicit ``task.task_names`` if given, else the benchmark's split."""
    from ript.envs.suites import get_suite

    return get_suite(str(task_cfg.suite)).task_names(task_cfg)


def data_files(task_cfg: DictConfig, names: list[str] | None = None) -> list[Path]:
    names = names or task_names(task_cfg)
    pattern = str(task_cfg.get("file_pattern") or "{name}.hdf5")  # official LIBERO files: {name}_demo.hdf5
    data_dir = Path(task_cfg.data_dir)
    if task_cfg.get("format") == "lerobot":  # a LeRobot v3.0 folder: its demos decoded once into HDF5 files
        from ript.data.lerobot import decoded_folder

        data_dir = decoded_folder(data_dir)
    files = [data_dir / pattern.format(name=n) for n in names]
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise RiptError(f"dataset file {missing[0]} does not exist; run `ript collect task={task_cfg.name}` first")
    _check_recorded_tasks(files, names)
    return files


def extra_data_files(names: list[str], dirs: list[str], key: str = "data.extra_dirs") -> list[Path]:
    """The files of these tasks in each of ``dirs`` (``<task>.hdf5``: episodes ``ript eval record_episodes=true``
    recorded); a folder that holds none of them is refused, naming the setting ``key`` that gave it."""
    files = []
    for folder in map(Path, dirs):
        found = [folder / f"{n}.hdf5" for n in names if (folder / f"{n}.hdf5").is_file()]
        if not found:
            raise RiptError(f"{key}: {folder} holds no file of the tasks {', '.join(names)} "
                            f"(<task>.hdf5, as `ript eval record_episodes=true` writes them)")
        _check_recorded_tasks(found, [p.stem for p in found])
        files += found
    return files


def _check_recorded_tasks(files: list[Path], names: list[str]) -> None:
    """Each file holds the task it is loaded for: a file replaced by another task's would train (and evaluate)
    the wrong task under this one's name. Files that record no task name (official LIBERO files) pass."""
    from ript.data.hdf5 import read_file_attrs

    for path, name in zip(files, names):
        recorded = read_file_attrs(path).get("task_name")
        if recorded is not None and str(recorded) != name:
            raise RiptError(f"{path} holds the demos of task {recorded!r}, but it is loaded for task {name!r}; "
                            f"put {name}'s own file there (ript collect writes it)")
