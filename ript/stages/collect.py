"""``ript collect``: scripted-expert demonstrations for the configured task list."""

from __future__ import annotations

from pathlib import Path

from ript.config import task_names, to_dict
from ript.envs.suites import task_horizon
from ript.utils.logging import setup_console_logging


def run(cfg) -> dict:
    setup_console_logging()
    names = task_names(cfg.task)
    from ript.experts.collect import collect_demos, require_complete

    workers = None if cfg.num_workers == "auto" else int(cfg.num_workers)
    noise = cfg.task.expert_noise if cfg.noise is None else cfg.noise
    stats = collect_demos(
        str(cfg.task.suite), names, Path(cfg.task.data_dir), int(cfg.task.demos_per_task),
        to_dict(cfg.task.render), task_horizon(cfg.task), seed=int(cfg.seed),
        noise=float(noise), filter_success=bool(cfg.filter_success), num_workers=workers,
        episodes_per_job=int(cfg.episodes_per_job), file_pattern=str(cfg.task.get("file_pattern", "{name}.hdf5")))
    if stats:
        print(f"{'task':<32} {'demos':>6} {'expert success':>15}")
        for t, s in stats.items():
            print(f"{t:<32} {s['demos']:>6d} {s['successes'] / max(1, s['attempts']):>15.1%}")
    require_complete(stats, int(cfg.task.demos_per_task), Path(cfg.task.data_dir))
    return stats
