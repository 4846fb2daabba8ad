"""Evaluation: run a chunk-policy checkpoint on simulator tasks; per-task and overall success, videos, JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from ript.config import resolve_device
from ript.envs.suites import get_suite
from ript.envs.runner import EnvRunner, success_table, write_results
from ript.errors import RiptError
from ript.model_loader import load_model
from ript.policies.chunk_policy import ChunkPolicy
from ript.utils.logging import log, setup_console_logging


def sampling_settings(ckpt: dict, overrides: dict | None = None) -> dict[str, Any]:
    """A checkpoint's sampling settings (RL records the ones it trained with), non-null overrides applied."""
    out = ckpt["metadata"].get("sampling")
    if out is None:
        algo = ckpt["cfg"]["algo"]
        out = {"action_horizon": algo["action_horizon"], **algo["sampling"]}
    out = dict(out)
    for k, v in (overrides or {}).items():
        if v is not None:
            out[k] = v
    return out


def make_runner(metadata: dict, task_names: list[str], eval_cfg, workers_cfg) -> EnvRunner:
    env_args = metadata.get("env_args") or {}
    if "render" not in env_args:
        raise RiptError("checkpoint metadata has no env_args.render; it was not trained on ript-collected data")
    return EnvRunner(
        suite=metadata["suite"],
        task_names=task_names,
        render=env_args["render"],  # same cameras, size and quality as the training images
        max_episode_steps=int(eval_cfg.get("max_episode_steps") or env_args["max_episode_steps"]),
        episodes_per_task=int(eval_cfg.episodes_per_task or get_suite(metadata["suite"]).standard_episodes),
        num_workers=eval_cfg.num_workers,
        seed=int(eval_cfg.seed),
        n_videos=int(eval_cfg.n_videos),
        worker_timeout_s=float(workers_cfg.timeout_s),
        max_worker_restarts=int(workers_cfg.max_restarts),
    )


def make_policy(model, settings: dict, device: str, seed: int, cuda_graph: bool = True) -> ChunkPolicy:
    return ChunkPolicy(model, action_horizon=int(settings["action_horizon"]), temperature=float(settings["temperature"]),
                       top_k=settings.get("top_k"), greedy=bool(settings.get("greedy", False)), device=device,
                       seed=seed, amp=device.startswith("cuda"), cuda_graph=cuda_graph)


def evaluate_during_training(runner: EnvRunner, model, settings: dict, device: str, seed: int, out_dir: Path,
                             logger, step: int, label: str, cuda_graph: bool = True) -> dict[str, Any]:
    """One evaluation of a chunk-policy model inside a training loop (see ``evaluate_policy``)."""
    return evaluate_policy(runner, lambda: make_policy(model, settings, device, seed, cuda_graph), device, out_dir,
                           logger, step, label)


def evaluate_policy(runner: EnvRunner, make: Callable[[], Any], device: str, out_dir: Path, logger, step: int,
                    label: str) -> dict[str, Any]:
    """Run the policy ``make()`` builds, leaving the training RNG streams untouched; write
    ``out_dir/results.json`` and videos, log ``eval/...`` metrics and the success table."""
    devices = [torch.device(device).index or 0] if device.startswith("cuda") else []
    with torch.random.fork_rng(devices=devices):
        results = runner.run(make(), video_dir=out_dir / "videos")
    write_results(out_dir / "results.json", results)
    logger.log({"eval/success_rate": results["success_rate"],
                **{f"eval/success/{t}": r["success_rate"] for t, r in results["per_task"].items()}}, step)
    log.info("%s eval:\n%s", label, success_table(results))
    return results


def results_dir(cfg, ckpt_dir: Path, step: int) -> Path:
    """``out_dir``, or ``<run_dir>/eval/step<N>`` for a checkpoint inside a run folder; never replaces an
    earlier results.json unless ``overwrite=true``."""
    if cfg.out_dir:
        out_dir = Path(cfg.out_dir)
    elif ckpt_dir.parent.name == "checkpoints":
        out_dir = ckpt_dir.parent.parent / "eval" / f"step{step:07d}"
    else:
        raise RiptError(f"checkpoint {ckpt_dir} is not inside a run folder (<run_dir>/checkpoints/<step>); "
                        f"pass out_dir=<folder> for the results")
    if (out_dir / "results.json").exists() and not cfg.overwrite:
        raise RiptError(f"{out_dir / 'results.json'} exists; pass overwrite=true to replace it or out_dir=<folder>")
    return out_dir


def run(cfg) -> dict[str, Any]:
    setup_console_logging()
    device = resolve_device(cfg.device)
    model, ckpt = load_model(cfg.checkpoint, expect_stage=("stage1", "finetune", "rl"), device=device)
    names = list(cfg.task_names) if cfg.task_names else model.task_names
    for n in names:
        model.task_index(n)
    out_dir = results_dir(cfg, Path(ckpt["checkpoint_dir"]), int(ckpt["step"]))
    settings = sampling_settings(ckpt, dict(cfg.sampling))
    runner = make_runner(ckpt["metadata"], names, cfg, cfg.workers)
    try:
        torch.manual_seed(int(cfg.seed))
        policy = make_policy(model, settings, device, int(cfg.seed), bool(cfg.cuda_graph))
        results = runner.run(policy, video_dir=out_dir / "videos")
    finally:
        runner.close()
    results.update(checkpoint=ckpt["checkpoint_dir"], sampling=settings)
    write_results(out_dir / "results.json", results)
    print(success_table(results))
    log.info("eval: %d env steps in %.1f s (%.0f steps/s); results in %s", results["env_steps"], results["seconds"],
             results["env_steps_per_second"], out_dir / "results.json")
    return results
