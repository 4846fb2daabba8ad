"""Evaluation runs shared by every stage: the runner built from a checkpoint's metadata, and one evaluation of a
policy (results file, videos, ``eval/...`` metrics, the success table) that leaves the training RNG untouched."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ript.envs.runner import EnvRunner, RunnerOptions
from ript.envs.suites import get_suite
from ript.envs.worker_env import PoolSettings
from ript.errors import RiptError
from ript.evaluation.results import success_table, summarize, write_evaluation
from ript.policies.build import make_policy
from ript.utils.logging import log


def runner_from_metadata(metadata: dict, task_names: list[str], workers_cfg, *, episodes_per_task: int | None,
                         num_workers, seed: int = 0, n_videos: int = 0, max_episode_steps: int | None = None,
                         on_worker_failure: str = "rerun", episodes_at_once: int | None = None,
                         driver_threads: int | None = None) -> EnvRunner:
    """The one place an env runner is built: the suite, cameras, image size and render quality the checkpoint's
    data was rendered with; ``episodes_per_task`` None: the suite's standard protocol; ``episodes_at_once``: the
    most episodes one run holds when the caller passes its own (RL), which bounds the workers worth starting;
    ``driver_threads``: the driving process's torch threads (None: the host's cores its workers leave)."""
    env_args = metadata.get("env_args") or {}
    if "render" not in env_args:
        raise RiptError("checkpoint metadata has no env_args.render; it was not trained on ript-collected data")
    return EnvRunner(RunnerOptions(
        suite=metadata["suite"],
        task_names=task_names,
        render=env_args["render"],  # same cameras, size and quality as the training images
        max_episode_steps=int(max_episode_steps or env_args["max_episode_steps"]),
        episodes_per_task=int(episodes_per_task or get_suite(metadata["suite"]).standard_episodes),
        num_workers=num_workers,
        seed=seed,
        n_videos=n_videos,
        pool=PoolSettings.from_config(workers_cfg),
        envs_per_worker=get_suite(metadata["suite"]).envs_per_worker if workers_cfg.envs_per_worker == "auto"
        else int(workers_cfg.envs_per_worker),
        on_worker_failure=on_worker_failure,
        episodes_at_once=episodes_at_once,
        driver_threads=driver_threads,
        pipeline_stages=workers_cfg.pipeline_stages,
        decisions=workers_cfg.decisions,
    ))


def make_runner(metadata: dict, task_names: list[str], eval_cfg, workers_cfg) -> EnvRunner:
    """An evaluation runner from an ``eval`` config block (``ript eval``'s top level, or a training stage's)."""
    return runner_from_metadata(metadata, task_names, workers_cfg, episodes_per_task=eval_cfg.episodes_per_task,
                                num_workers=eval_cfg.num_workers, seed=int(eval_cfg.seed),
                                n_videos=int(eval_cfg.n_videos), max_episode_steps=eval_cfg.get("max_episode_steps"))


def evaluate_during_training(runner: EnvRunner, model, settings: dict, device: str, seed: int, out_dir: Path,
                             logger, step: int, label: str, cuda_graph: bool = True) -> dict[str, Any]:
    """One evaluation of a chunk-policy model inside a training loop (see ``evaluate_policy``)."""
    return evaluate_policy(runner, lambda: make_policy(model, settings, device, seed, cuda_graph), device, out_dir,
                           logger, step, label, {"sampling": settings})


def evaluate_policy(runner: EnvRunner, make: Callable[[], Any], device: str, out_dir: Path, logger, step: int,
                    label: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the policy ``make()`` builds, leaving the training RNG streams untouched; write
    ``out_dir/results.json`` and videos, log ``eval/...`` metrics and the success table."""
    devices = [torch.device(device).index or 0] if device.startswith("cuda") else []
    with torch.random.fork_rng(devices=devices):
        results = summarize(runner.run(make(), video_dir=out_dir / "videos"))
    results.update(extra or {})  # e.g. the decoding, as `ript eval` records it
    write_evaluation(out_dir, results, label)
    logger.log({"eval/success_rate": results["success_rate"],
                **{f"eval/success/{t}": r["success_rate"] for t, r in results["per_task"].items()}}, step)
    log.info("%s eval:\n%s", label, success_table(results))
    return results
