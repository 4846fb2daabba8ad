"""``ript export`` / ``ript import``: demonstrations to a LeRobotDataset v3.0 folder and back."""

from __future__ import annotations

from pathlib import Path

from ript.config import data_files, task_names
from ript.envs.suites import get_suite
from ript.utils.logging import log, setup_console_logging


def run_export(cfg) -> dict:
    from ript.data.lerobot import export_lerobot

    setup_console_logging()
    suite = str(cfg.task.suite)
    files = data_files(cfg.task, task_names(cfg.task))
    info = export_lerobot(files, Path(cfg.out), get_suite(suite).control_hz, str(cfg.codec), int(cfg.crf),
                          cfg.robot_type or suite)
    log.info("export: %d episodes, %d frames, %d tasks -> %s", info["total_episodes"], info["total_frames"],
             info["total_tasks"], cfg.out)
    return info


def run_import(cfg) -> list[Path]:
    from ript.data.lerobot import import_lerobot

    setup_console_logging()
    written = import_lerobot(Path(cfg.src), Path(cfg.data_dir))
    log.info("import: %d files -> %s", len(written), cfg.data_dir)
    return written
