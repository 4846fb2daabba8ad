"""``ript collect``: scripted-expert demonstrations for the configured task list."""

from __future__ import annotations

from pathlib import Path

from ript.config import task_names, to_dict
from ript.envs.suites import task_horizon
from ript.errors import RiptError
from ript.utils.logging import setup_console_logging


def run(cfg) -> dict:
    setup_console_logging()
    names = task_names(cfg.task)
    from ript.experts.collect import collect_demos

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
    short = [t for t, s in stats.items() if s["demos"] < int(cfg.task.demos_per_task)]
    if short:
        s = stats[short[0]]
        raise RiptError(f"collect: the expert reached only {s['demos']} of {cfg.task.demos_per_task} successful demos "
                        f"for {short[0]!r} in {s['attempts']} attempts (kept in "
                        f"{Path(cfg.task.data_dir) / ('.' + short[0] + '.incomplete.hdf5')}); raise "
                        f"task.max_episode_steps or set filter_success=false")
    return stats
