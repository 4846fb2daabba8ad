"""``ript quickstart``: collect -> stage 0 -> stage 1 -> eval in one command (two MetaWorld tasks by default).

Run again after an interruption, the same command continues where it stopped: collection keeps its finished jobs,
each training stage resumes from its last checkpoint (a finished one has nothing left to do), and the evaluation
runs again."""

from __future__ import annotations

import time
from pathlib import Path

from ript.config import compose, override
from ript.stages.protocol import group_overrides
from ript.utils.locking import holding
from ript.utils.logging import log, setup_console_logging


def stage_configs(cfg) -> dict:
    """The composed config of each job quickstart runs, in order; a stage whose run folder an earlier start
    left resumes it."""
    root = Path(cfg.run_root)
    shared = group_overrides("task", cfg.task) + group_overrides("algo", cfg.algo)
    s0, s1 = root / "stage0", root / "stage1"

    def resume(run_dir: Path) -> list[str]:
        return ["resume=true"] if run_dir.is_dir() else []

    return {
        "collect": compose("collect", group_overrides("task", cfg.task)),
        "stage0": compose("stage0", shared + [override("run_dir", s0), f"train.steps={cfg.stage0.steps}",
                                              f"train.batch_size={cfg.stage0.batch_size}",
                                              f"train.lr={cfg.stage0.lr}", "train.val_every=100", *resume(s0)]),
        "stage1": compose("stage1", shared + [override("run_dir", s1), override("stage0_checkpoint", s0),
                                              f"train.steps={cfg.stage1.steps}",
                                              f"train.batch_size={cfg.stage1.batch_size}",
                                              f"train.lr={cfg.stage1.lr}", "train.val_every=200", *resume(s1)]),
        "eval": compose("eval", [override("checkpoint", s1), f"episodes_per_task={cfg.eval_episodes}",
                                 override("out_dir", root / "eval"), "overwrite=true"]),
    }


def run(cfg) -> dict:
    from ript.stages import collect, evaluate, stage0, stage1

    setup_console_logging()
    t0 = time.perf_counter()
    root = Path(cfg.run_root)
    with holding(root, "run_root"):  # one quickstart per run root, checked writable before anything runs
        configs = stage_configs(cfg)  # every job's config is checked before the first one starts
        collect.run(configs["collect"])
        stage0.run(configs["stage0"])
        stage1.run(configs["stage1"])
        results = evaluate.run(configs["eval"])
    log.info("quickstart finished in %.1f min", (time.perf_counter() - t0) / 60)
    print(f"\nOutputs: demonstrations in {cfg.task.data_dir}/, checkpoints in {root / 'stage0'}/ and "
          f"{root / 'stage1'}/, evaluation (results.json, videos/) in {root / 'eval'}/, TensorBoard logs: "
          f"tensorboard --logdir {root}")
    return results
