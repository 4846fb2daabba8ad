"""``ript eval``: run a checkpoint of any policy family on simulator tasks; per-task and overall success, videos,
JSON. ``policy=skill_prior`` (the default): a stage-1, finetune or RL checkpoint, decoded with the settings it
records (``sampling:`` overrides them); ``policy=openvla_oft`` / ``policy=openvla``: an official folder or an RL
run of one, with ``task=<suite>``, decoded deterministically."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import torch

from ript.config import to_dict
from ript.envs.episodes import repeated_layouts
from ript.envs.suites import get_suite
from ript.errors import RiptError
from ript.evaluation.calibration import (
    CALIBRATION_FILE,
    calibrate,
    calibration_line,
    calibration_table,
    episode_specs,
    simulator_episodes,
)
from ript.evaluation.environments import EnvironmentSetting, build_environment
from ript.evaluation.recording import EpisodeFiles
from ript.evaluation.results import success_table, summarize, write_evaluation
from ript.policies.families import family_for
from ript.utils.atomic import atomic_write_text
from ript.utils.checkpoint import resolve_checkpoint_dir
from ript.utils.device import resolve_device
from ript.utils.locking import holding
from ript.utils.logging import log, setup_console_logging


def run(cfg) -> dict[str, Any]:
    """``ript eval``: the evaluation settings (episodes, workers, seed, videos) at the config's top level."""
    return evaluate(cfg, cfg)


def evaluate(cfg, protocol) -> dict[str, Any]:
    """Evaluate the job's checkpoint with the evaluation settings ``protocol`` (``eval/protocol.yaml``'s keys)."""
    setup_console_logging()
    device = resolve_device(cfg.device)
    family = family_for(cfg)
    if cfg.environment.name != "simulator" and not cfg.out_dir:  # the run's eval/ folders hold simulator results
        raise RiptError(f"environment={cfg.environment.name}: pass out_dir=<folder> for its results")
    calibrating = cfg.get("calibrate_against")
    if calibrating and cfg.environment.name != "world_model":
        raise RiptError("calibrate_against=<a simulator evaluation> calibrates a world model: pass "
                        "environment=world_model environment.checkpoint=<it>")
    draws = int(cfg.get("draws_per_layout") or 1)
    if calibrating and draws > 1:
        raise RiptError(f"draws_per_layout={draws} with calibrate_against: calibration runs the episodes of the "
                        f"simulator evaluation it reads; set draws_per_layout on that evaluation")
    loaded = family.load(cfg, device, int(cfg.seed), rl=False)
    # the simulator's episodes of this checkpoint, run again in the world model, each to its horizon
    real = simulator_episodes(calibrating, loaded.results) if calibrating else None
    out_dir, title = family.eval_output(loaded, cfg)
    with holding(out_dir, "out_dir"):  # one writer, checked writable before the first episode
        runner = build_environment(EnvironmentSetting(
            cfg.environment, cfg.workers, loaded.metadata, loaded.task_names, loaded.policy, device,
            protocol.num_workers, protocol.get("max_episode_steps"), protocol.episodes_per_task,
            int(protocol.seed), int(protocol.n_videos), to_the_horizon=bool(calibrating)))
        specs, sink = (episode_specs(real) if real else None), None
        if draws > 1:  # several noise streams from each start: what calibration compares the world model with
            specs = repeated_layouts(runner.specs(), draws)
        if cfg.get("record_episodes"):  # every step kept: the episodes as demonstration files of the tasks
            specs = [dataclasses.replace(spec, keep=True) for spec in specs or runner.specs()]
            sink = EpisodeFiles(out_dir / "episodes", loaded.metadata,
                                get_suite(loaded.metadata["suite"]).instructions(loaded.task_names))
        try:
            torch.manual_seed(int(cfg.seed))
            results = summarize(runner.run(loaded.policy, video_dir=out_dir / "videos", specs=specs, sink=sink))
        finally:
            runner.close()
        if sink is not None:
            results["episode_files"] = [str(p) for p in sink.finish()]
        results.update(loaded.results, environment=to_dict(cfg.environment), draws_per_layout=draws)
        if real:
            calibration = {**calibrate(real, results["episodes"]), "checkpoint": loaded.results["checkpoint"],
                           "world_model": str(resolve_checkpoint_dir(cfg.environment.checkpoint)),
                           "calibrated_against": str(calibrating)}
            atomic_write_text(out_dir / CALIBRATION_FILE, json.dumps(calibration, indent=2))
        write_evaluation(out_dir, results, title)
    print(success_table(results))
    if real:
        print(calibration_table(calibration))
        print(calibration_line(calibration))
    log.info("eval: %d env steps in %.1f s (%.0f steps/s); results in %s", results["env_steps"], results["seconds"],
             results["env_steps_per_second"], out_dir / "results.json")
    return results
