"""Where a policy's episodes run, chosen by ``environment=`` (``configs/environment/``): the simulator's env
workers, or a world model trained on the suite (``ript world-model``) that starts each episode from the
simulator's real first observation. RL's rollouts and ``ript eval`` build their runner here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ript.envs.demo_starts import DemoFrames
from ript.envs.episodes import Runner
from ript.envs.imagination import ImaginationOptions, ImaginedRunner, InitialFrames
from ript.envs.runner import default_num_workers
from ript.envs.suites import get_suite
from ript.envs.worker_env import PoolSettings
from ript.errors import RiptError
from ript.evaluation.calibration import calibrated_threshold
from ript.evaluation.runner import runner_from_metadata
from ript.model_loader import load_model
from ript.policies.base import ChunkingPolicy
from ript.registry import ENVIRONMENTS
from ript.utils.checkpoint import resolve_checkpoint_dir


@dataclass(frozen=True)
class EnvironmentSetting:
    """What a runner is built from: the ``environment`` and ``workers`` config sections, the policy's checkpoint
    metadata, its tasks and the policy, the device; worker processes; the episode horizon (None: the
    checkpoint's); the evaluation protocol (episodes per task, None: the suite's standard; seed; videos) for
    callers that pass no episodes of their own; what a lost worker's episodes become; the most episodes one run
    holds; the driving process's torch threads; in a world model, whether every episode runs to the horizon (its
    success head's peak recorded, for ``calibrate_against``)."""
    environment: Any
    workers: Any
    metadata: dict
    task_names: list[str]
    policy: ChunkingPolicy
    device: str
    num_workers: int | str
    max_episode_steps: int | None = None
    episodes_per_task: int | None = None
    seed: int = 0
    n_videos: int = 0
    on_worker_failure: str = "rerun"
    episodes_at_once: int | None = None
    driver_threads: int | None = None
    to_the_horizon: bool = False

    @property
    def horizon(self) -> int:
        return int(self.max_episode_steps or self.metadata["env_args"]["max_episode_steps"])


def build_environment(setting: EnvironmentSetting) -> Runner:
    """The runner ``setting.environment.name`` names, checked against the policy before any episode runs."""
    return ENVIRONMENTS.build(str(setting.environment.name), setting=setting)


@ENVIRONMENTS.register("simulator")
def simulator(setting: EnvironmentSetting) -> Runner:
    return runner_from_metadata(setting.metadata, setting.task_names, setting.workers,
                                episodes_per_task=setting.episodes_per_task, num_workers=setting.num_workers,
                                seed=setting.seed, n_videos=setting.n_videos,
                                max_episode_steps=setting.max_episode_steps,
                                on_worker_failure=setting.on_worker_failure, driver_threads=setting.driver_threads,
                                episodes_at_once=setting.episodes_at_once)


@ENVIRONMENTS.register("world_model")
def world_model(setting: EnvironmentSetting) -> Runner:
    env = setting.environment
    if not env.checkpoint:
        raise RiptError("environment=world_model needs environment.checkpoint=<a `ript world-model` run>")
    model, config = load_model(env.checkpoint, expect_stage="world_model", device=setting.device)
    check_world_model(str(env.checkpoint), config, setting)
    if env.get("denoise_steps") is not None:
        model.set_denoise_steps(int(env.denoise_steps))
    suite = setting.metadata["suite"]
    episodes = int(setting.episodes_per_task or get_suite(suite).standard_episodes)
    horizon = setting.horizon
    if env.starts == "demo_frames":  # a few chunks from real frames along the demos
        initial = DemoFrames.of_world_model(config, [*model.image_keys, *model.lowdim_keys])
        horizon = min(horizon, int(env.start_chunks) * model.chunk)
    else:
        # the workers that render the first frames: as many as asked ("auto": a core each), no more than the frames
        workers = default_num_workers(setting.num_workers, episodes * len(setting.task_names))
        initial = InitialFrames(suite, setting.metadata["env_args"]["render"], horizon, workers,
                                PoolSettings.from_config(setting.workers))
    threshold = None if setting.to_the_horizon else success_threshold(env, config)
    options = ImaginationOptions(list(setting.task_names), horizon, int(env.envs), threshold, episodes,
                                 setting.seed, setting.n_videos)
    return ImaginedRunner(model, options, initial, setting.device)


def success_threshold(env, config: dict) -> float:
    """The success head's probability that ends an imagined episode with success: a calibration's (``calibration``),
    else ``success_threshold``: a number, or ``head``, the threshold at which a head trained on the model's own
    imagination (``ript world-model-head``) best told its held-out episodes' successes from their failures."""
    if env.get("calibration"):
        return calibrated_threshold(env.calibration, resolve_checkpoint_dir(env.checkpoint))
    if env.success_threshold != "head":
        return float(env.success_threshold)
    head = (config.get("metadata") or {}).get("success_head") or {}
    best = ((head.get("held_out") or {}).get("after") or {}).get("episode_best")
    if not best:
        raise RiptError(f"environment.success_threshold=head: environment.checkpoint={env.checkpoint} has no head "
                        f"measured on held-out episodes of its own imagination (`ript world-model-head` writes it)")
    return float(best["threshold"])


def check_world_model(path: str, config: dict, setting: EnvironmentSetting) -> None:
    """The world model predicts what the policy reads, in the policy's suite, for the policy's tasks."""
    meta, kwargs = config.get("metadata") or {}, config["model_kwargs"]
    suite, wanted = meta.get("suite"), setting.metadata.get("suite")
    if suite != wanted:
        raise RiptError(f"environment.checkpoint={path} models suite {suite}; the policy acts in {wanted}")
    ours, theirs = setting.metadata["env_args"]["render"], (meta.get("env_args") or {}).get("render") or {}
    if int(ours["image_size"]) != int(kwargs["image_size"]) or list(ours["cameras"]) != list(theirs.get("cameras", [])):
        raise RiptError(f"environment.checkpoint={path} predicts {kwargs['image_size']}-pixel images of cameras "
                        f"{list(theirs.get('cameras', []))}; the policy reads {ours['image_size']}-pixel images of "
                        f"{list(ours['cameras'])}")
    predicted = {*kwargs["image_keys"], *kwargs["lowdim_dims"]}
    missing = [k for k in setting.policy.obs_keys or [] if k not in predicted]
    if missing:
        raise RiptError(f"environment.checkpoint={path} does not predict {missing[0]}, which the policy reads "
                        f"(it predicts {', '.join(sorted(predicted))})")
    unknown = [t for t in setting.task_names if t not in kwargs["task_names"]]
    if unknown:
        raise RiptError(f"environment.checkpoint={path} was not trained on task {unknown[0]} "
                        f"(it knows {', '.join(kwargs['task_names'])})")
    if setting.policy.action_horizon % int(kwargs["chunk"]):
        raise RiptError(f"environment.checkpoint={path} steps {kwargs['chunk']} actions at a time; the policy "
                        f"executes {setting.policy.action_horizon} per decision (sampling.action_horizon must be a "
                        f"multiple)")
