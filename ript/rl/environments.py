"""Where RL's rollouts run, chosen by ``rl.environment``: the simulator's env workers, or a world model trained on
the suite (``ript world-model``) that starts each episode from the simulator's real first observation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ript.envs.imagination import ImaginationOptions, ImaginedRunner, InitialFrames
from ript.errors import RiptError
from ript.evaluation.runner import runner_from_metadata
from ript.model_loader import load_model
from ript.policies.base import ChunkingPolicy
from ript.registry import ENVIRONMENTS
from ript.rl.rollout import GroupSampling
from ript.utils import distributed as ddist


@dataclass(frozen=True)
class RolloutSetting:
    """What an RL environment is built from: the job's config, the policy's checkpoint metadata and tasks, the
    policy, this rank's device, its env workers and driver threads, and the most episodes one round holds."""
    cfg: Any
    metadata: dict
    task_names: list[str]
    policy: ChunkingPolicy
    device: str
    num_workers: int
    driver_threads: int
    episodes_at_once: int

    @property
    def max_episode_steps(self) -> int:
        return int(self.cfg.rl.max_episode_steps or self.metadata["env_args"]["max_episode_steps"])


def rollout_environment(cfg, info: ddist.DistInfo, metadata: dict, task_names: list[str], policy: ChunkingPolicy,
                        device: str):
    """This rank's rollout runner (``rl.environment``), built and checked before the run folder is created. Its
    share of the host: its env workers, and the cores they leave to the policy's host-side ops."""
    share = info.cores_per_rank()
    workers = share if cfg.rl.num_workers == "auto" else int(cfg.rl.num_workers)
    at_once = GroupSampling.from_config(cfg.rl).most_episodes_per_round(info.world_size)
    return ENVIRONMENTS.build(str(cfg.rl.environment), setting=RolloutSetting(
        cfg, metadata, task_names, policy, device, workers, max(1, share - workers), at_once))


@ENVIRONMENTS.register("simulator")
def simulator(setting: RolloutSetting):
    return runner_from_metadata(setting.metadata, setting.task_names, setting.cfg.workers, episodes_per_task=1,
                                num_workers=setting.num_workers, max_episode_steps=setting.cfg.rl.max_episode_steps,
                                on_worker_failure="drop", driver_threads=setting.driver_threads,
                                episodes_at_once=setting.episodes_at_once)


@ENVIRONMENTS.register("world_model")
def world_model(setting: RolloutSetting) -> ImaginedRunner:
    cfg = setting.cfg.rl.world_model
    if not cfg.checkpoint:
        raise RiptError("rl.environment=world_model needs rl.world_model.checkpoint=<a `ript world-model` run>")
    if setting.cfg.rl.reward == "dense":
        raise RiptError("rl.reward=dense: a world model predicts success only; use rl.reward=sparse")
    model, config = load_model(cfg.checkpoint, expect_stage="world_model", device=setting.device)
    check_world_model(str(cfg.checkpoint), config, setting)
    render = setting.metadata["env_args"]["render"]
    workers = setting.cfg.workers
    initial = InitialFrames(setting.metadata["suite"], render, setting.max_episode_steps, setting.num_workers,
                            float(workers.timeout_s), int(workers.max_restarts))
    options = ImaginationOptions(list(setting.task_names), setting.max_episode_steps, int(cfg.envs),
                                 float(cfg.success_threshold))
    return ImaginedRunner(model, options, initial, setting.device)


def check_world_model(path: str, config: dict, setting: RolloutSetting) -> None:
    """The world model predicts what the policy reads, in the policy's suite, for the policy's tasks."""
    meta, kwargs = config.get("metadata") or {}, config["model_kwargs"]
    suite, wanted = meta.get("suite"), setting.metadata.get("suite")
    if suite != wanted:
        raise RiptError(f"rl.world_model.checkpoint={path} models suite {suite}; the policy acts in {wanted}")
    ours, theirs = setting.metadata["env_args"]["render"], (meta.get("env_args") or {}).get("render") or {}
    if int(ours["image_size"]) != int(kwargs["image_size"]) or list(ours["cameras"]) != list(theirs.get("cameras", [])):
        raise RiptError(f"rl.world_model.checkpoint={path} predicts {kwargs['image_size']}-pixel images of cameras "
                        f"{list(theirs.get('cameras', []))}; the policy reads {ours['image_size']}-pixel images of "
                        f"{list(ours['cameras'])}")
    predicted = {*kwargs["image_keys"], *kwargs["lowdim_dims"]}
    missing = [k for k in setting.policy.obs_keys or [] if k not in predicted]
    if missing:
        raise RiptError(f"rl.world_model.checkpoint={path} does not predict {missing[0]}, which the policy reads "
                        f"(it predicts {', '.join(sorted(predicted))})")
    unknown = [t for t in setting.task_names if t not in kwargs["task_names"]]
    if unknown:
        raise RiptError(f"rl.world_model.checkpoint={path} was not trained on task {unknown[0]} "
                        f"(it knows {', '.join(kwargs['task_names'])})")
    if setting.policy.action_horizon % int(kwargs["chunk"]):
        raise RiptError(f"rl.world_model.checkpoint={path} steps {kwargs['chunk']} actions at a time; the policy "
                        f"executes {setting.policy.action_horizon} per decision (sampling.action_horizon must be a "
                        f"multiple)")
