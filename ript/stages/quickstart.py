"""``ript quickstart``: collect -> stage 0 -> stage 1 -> eval in one command (two MetaWorld tasks by default)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ript.config import compose, to_dict
from ript.utils.logging import log, setup_console_logging


def task_overrides(task_cfg) -> list[str]:
    """The composed task config as overrides for the other jobs' configs, so every task setting carries over."""
    def leaves(prefix: str, value):
        if isinstance(value, dict):
            for k, v in value.items():
                yield from leaves(f"{prefix}.{k}", v)
        else:
            yield f"{prefix}={json.dumps(value)}"

    return [f"task={task_cfg.name}", *leaves("task", to_dict(task_cfg))]


def run(cfg) -> dict:
    from ript.stages import collect, evaluate, stage0, stage1

    setup_console_logging()
    t0 = time.perf_counter()
    root = Path(cfg.run_root)
    task = task_overrides(cfg.task)
    algo = [f"algo={cfg.algo.name}"]
    collect.run(compose("collect", task))
    s0 = root / "stage0"
    stage0.run(compose("stage0", task + algo + [f"run_dir={s0}", f"train.steps={cfg.stage0.steps}",
                                                 f"train.batch_size={cfg.stage0.batch_size}",
                                                 f"train.lr={cfg.stage0.lr}", "train.val_every=100"]))
    s1 = root / "stage1"
    stage1.run(compose("stage1", task + algo + [f"run_dir={s1}", f"stage0_checkpoint={s0}",
                                                 f"train.steps={cfg.stage1.steps}",
                                                 f"train.batch_size={cfg.stage1.batch_size}",
                                                 f"train.lr={cfg.stage1.lr}", "train.val_every=200"]))
    results = evaluate.run(compose("eval", [f"checkpoint={s1}", f"episodes_per_task={cfg.eval_episodes}",
                                            f"out_dir={root / 'eval'}"]))
    log.info("quickstart finished in %.1f min", (time.perf_counter() - t0) / 60)
    print(f"\nOutputs: demonstrations in {cfg.task.data_dir}/, checkpoints in {s0}/ and {s1}/, "
          f"evaluation (results.json, videos/) in {root / 'eval'}/, TensorBoard logs: tensorboard --logdir {root}")
    return results
