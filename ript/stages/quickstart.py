"""``ript quickstart``: collect -> stage 0 -> stage 1 -> eval on a couple of MetaWorld tasks."""

from __future__ import annotations

import time
from pathlib import Path

from ript.config import compose
from ript.utils.logging import log, setup_console_logging


def run(cfg) -> dict:
    from ript.stages import collect, evaluate, stage0, stage1

    setup_console_logging()
    t0 = time.perf_counter()
    root = Path(cfg.run_root)
    task = [f"task={cfg.task.name}", f"task.data_dir={cfg.task.data_dir}",
            f"task.demos_per_task={cfg.task.demos_per_task}"]
    algo = [f"algo={cfg.algo}"]
    collect.run(compose("collect", task))
    s0 = root / "stage0"
    stage0.run(compose("stage0", task + algo + [f"run_dir={s0}", f"train.steps={cfg.stage0_steps}",
                                                 "train.batch_size=128", "train.val_every=100"]))
    s1 = root / "stage1"
    stage1.run(compose("stage1", task + algo + [f"run_dir={s1}", f"stage0_checkpoint={s0}",
                                                 f"train.steps={cfg.stage1_steps}", "train.batch_size=64",
                                                 "train.val_every=200", "train.lr=1e-3"]))
    results = evaluate.run(compose("eval", [f"checkpoint={s1}", f"episodes_per_task={cfg.eval_episodes}",
                                            f"out_dir={root / 'eval'}"]))
    log.info("quickstart finished in %.1f min", (time.perf_counter() - t0) / 60)
    print(f"\nOutputs: demonstrations in {cfg.task.data_dir}/, checkpoints in {s0}/ and {s1}/, "
          f"evaluation (results.json, videos/) in {root / 'eval'}/, TensorBoard logs: tensorboard --logdir {root}")
    return results
