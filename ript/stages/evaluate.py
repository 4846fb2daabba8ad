"""``ript eval``: run a chunk-policy checkpoint on simulator tasks; per-task and overall success, videos, JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ript.config import resolve_device
from ript.envs.evaluation import evaluation_dir, make_runner, results_dir, write_evaluation
from ript.envs.runner import success_table
from ript.errors import RiptError
from ript.model_loader import load_model
from ript.policies.build import make_policy, sampling_settings
from ript.utils.logging import log, setup_console_logging


def output_dir(cfg, ckpt_dir: Path, step: int) -> Path:
    """``out_dir``, or ``<run_dir>/eval/step<N>`` for a checkpoint inside a run folder; never replaces an
    earlier results.json unless ``overwrite=true``."""
    if cfg.out_dir:
        out_dir = Path(cfg.out_dir)
    elif ckpt_dir.parent.name == "checkpoints":
        out_dir = evaluation_dir(ckpt_dir.parent.parent, step)
    else:
        raise RiptError(f"checkpoint {ckpt_dir} is not inside a run folder (<run_dir>/checkpoints/<step>); "
                        f"pass out_dir=<folder> for the results")
    return results_dir(out_dir, bool(cfg.overwrite))


def run(cfg) -> dict[str, Any]:
    setup_console_logging()
    device = resolve_device(cfg.device)
    model, ckpt = load_model(cfg.checkpoint, expect_stage=("stage1", "finetune", "rl"), device=device)
    names = list(cfg.task_names) if cfg.task_names else model.task_names
    for n in names:
        model.task_index(n)
    out_dir = output_dir(cfg, Path(ckpt["checkpoint_dir"]), int(ckpt["step"]))
    settings = sampling_settings(ckpt["metadata"], dict(cfg.sampling), ckpt["cfg"])
    runner = make_runner(ckpt["metadata"], names, cfg, cfg.workers)
    try:
        torch.manual_seed(int(cfg.seed))
        policy = make_policy(model, settings, device, int(cfg.seed), bool(cfg.cuda_graph))
        results = runner.run(policy, video_dir=out_dir / "videos")
    finally:
        runner.close()
    results.update(checkpoint=ckpt["checkpoint_dir"], sampling=settings)
    write_evaluation(out_dir, results, f"{Path(ckpt['checkpoint_dir']).parent.parent.name} step {ckpt['step']}")
    print(success_table(results))
    log.info("eval: %d env steps in %.1f s (%.0f steps/s); results in %s", results["env_steps"], results["seconds"],
             results["env_steps_per_second"], out_dir / "results.json")
    return results
