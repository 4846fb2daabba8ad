"""``ript collect``: scripted-expert demonstrations for the configured task list."""

from __future__ import annotations

from pathlib import Path

from ript.config import task_names
from ript.errors import RiptError
from ript.utils.logging import setup_console_logging


def run(cfg) -> dict:
    setup_console_logging()
    names = task_names(cfg.task)
    if cfg.task.suite != "metaworld":
        raise RiptError(f"collect: no scripted experts for suite {cfg.task.suite!r}")
    from ript.data.collect_metaworld import collect_metaworld
    from ript.envs.metaworld import RenderSettings

    workers = None if cfg.num_workers == "auto" else int(cfg.num_workers)
    stats = collect_metaworld(
        names, Path(cfg.task.data_dir), int(cfg.task.demos_per_task),
        RenderSettings.from_dict(cfg.task.render), int(cfg.task.max_episode_steps), seed=int(cfg.seed),
        noise=float(cfg.noise), filter_success=bool(cfg.filter_success), num_workers=workers,
        episodes_per_job=int(cfg.episodes_per_job))
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
