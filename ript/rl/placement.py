"""Where RL's rollouts run (``placement.mode``, docs/distributed.md).

- ``collocated`` (the default; no Ray): each rank's own process holds the policy, drives its env workers
  (processes or Ray actors, ``workers.backend``) and trains.
- ``disaggregated``: each rank starts a Ray actor that holds a copy of the policy and the rank's environment (its
  env workers, or a world model on the actor's own GPU: ``placement.rollout_gpus``) and runs the rank's rollouts
  there; the rank keeps the learner, the update and the checkpoints. Before each round of rollouts the rank's
  trainable weights (and critic) go to the actor over a channel of their own (``WeightChannel``), and the
  policy's random stream goes with them and comes back, so a run makes the episodes, the updates and the
  checkpoints of a collocated run and resumes the same way.
- ``hybrid``: ``disaggregated`` with the GPUs split by role, as RLinf's hybrid mode splits them: every rank's
  simulators render on ``placement.env_gpus``, the rollout actors act on the host's other GPUs (a share of one
  each, ``placement.rollout_gpus``), the two pipelined in two stages (one group of env workers simulates while
  the other's decision is made), and the trainers, one per GPU, update after the rollouts.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ript.envs.gl import physical_gpu
from ript.envs.seeds import rank_seed
from ript.errors import RiptError
from ript.registry import PLACEMENTS
from ript.rl.advantages import build_estimator
from ript.rl.episode_transfer import pack_episodes, unpack_episodes
from ript.rl.rollout import rollout_environment
from ript.utils import distributed as ddist
from ript.utils.containers import to_dict
from ript.utils.logging import log, setup_console_logging
from ript.utils.processes import ranks_on_this_host
from ript.utils.weight_sync import Endpoint, WeightChannel, channel_backend


def synced_modules(learner) -> torch.nn.Module:
    """What the rollout side needs of the trainer after an update: the trainable weights and the critic."""
    parts = {"weights": learner.weights}
    if learner.critic is not None:
        parts["critic"] = learner.critic
    return torch.nn.ModuleDict(parts)


def actor_config(cfg, trainer_gpus: tuple[int, ...]) -> dict:
    """The job's config as its rollout actor reads it. A trainer on a GPU lends it to its actor's simulators: the
    trainer waits while they render, and another rank's actor computing on a GPU they rendered on would plan
    several times slower (``ript.envs.gl.renders_apart``). Its env workers share the host's memory with the other
    ranks' as the ranks' own would (an actor is no torchrun process: it would count itself the host's only one)."""
    settings = to_dict(cfg)
    if trainer_gpus and cfg.workers.get("render_gpus") is None:
        settings["workers"]["render_gpus"] = list(trainer_gpus)
    if cfg.workers.get("host_sets") is None:
        settings["workers"]["host_sets"] = ranks_on_this_host()
    return settings


def critic_settings(cfg):
    return cfg.rl.critic if build_estimator(cfg.rl).uses_critic else None


@PLACEMENTS.register("collocated")
class Collocated:
    """The rank's own process rolls out with the policy it trains."""

    remote = False  # the rollouts run in this process, with the modules it trains

    def __init__(self, cfg, info: ddist.DistInfo, loaded, device: str):
        self.runner = rollout_environment(cfg, info, loaded.metadata, loaded.task_names, loaded.policy, device)

    modules = None  # nothing travels: the runner acts with the learner's own modules

    def attach(self, learner) -> None:
        pass

    def sync(self, modules: torch.nn.Module | None = None) -> None:
        pass


def normal_priority() -> int:
    """Ray starts its workers at niceness 15, below every other process of the host; a rollout actor and the env
    workers it starts are the run's critical path, so they take niceness 0 (a process's default) back where the host
    allows it (raising a priority needs the right to). Returns the niceness they run at."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    except OSError:
        pass
    return os.getpriority(os.PRIO_PROCESS, 0)


class RolloutActor:
    """Inside a Ray actor: the rank's policy and environment, built from the job's config as the rank builds them,
    acting with the weights the rank sends."""

    def __init__(self, cfg_dict: dict, info: ddist.DistInfo, device: str, cwd: str):
        from omegaconf import OmegaConf

        from ript.policies.families import family_for

        setup_console_logging()
        self.device = device
        self.niceness = normal_priority()
        if Path(cwd).is_dir():
            os.chdir(cwd)  # the job's relative paths (checkpoints, data) as the rank reads them
        cfg = OmegaConf.create(cfg_dict)
        family = family_for(cfg)
        self.loaded = family.load(cfg, device, rank_seed(int(cfg.seed), info.rank), rl=True)
        self.learner = family.learner(self.loaded, cfg, device, critic_settings(cfg))
        self.learner.attach(self.loaded.policy)
        self.runner = rollout_environment(cfg, info, self.loaded.metadata, self.loaded.task_names,
                                          self.loaded.policy, device)
        self.channel: WeightChannel | None = None

    def describe(self) -> dict:
        import ray

        gpu = physical_gpu(torch.cuda.current_device()) if self.device.startswith("cuda") else None
        return {"env_slots": self.runner.env_slots, "shaped_reward": self.runner.shaped_reward,
                "node": ray.get_runtime_context().get_node_id(), "gpu": gpu, "niceness": self.niceness}

    def join(self, host: str, port: int, timeout_s: float, backend: str) -> None:
        self.channel = WeightChannel(WeightChannel.connect(host, port, timeout_s), 1, timeout_s, backend,
                                     self.device)

    def receive_weights(self) -> int:
        return self.channel.transfer(synced_modules(self.learner))

    def specs(self) -> list:
        return self.runner.specs()

    def run(self, generator_state: torch.Tensor, video_dir: Path | None, specs: list | None, stop) -> tuple:
        """The rank's rollouts with the random stream it sent; the stream, the stop rule as they ended and the
        planning time go back with the results."""
        policy = self.loaded.policy
        policy.generator.set_state(generator_state)
        seconds, calls = policy.inference_seconds, policy.plan_calls
        results = self.runner.run(policy, video_dir=video_dir, specs=specs, stop=stop)
        return (pack_episodes(results), policy.generator.get_state(), stop, policy.inference_seconds - seconds,
                policy.plan_calls - calls)

    def close(self) -> None:
        self.runner.close()


@PLACEMENTS.register("disaggregated")
class Disaggregated:
    """The rank's rollouts in a Ray actor of their own (``RolloutActor``), reached through ``RemoteRunner``."""

    remote = True  # the rollouts run in an actor, with the weights last sent

    def __init__(self, cfg, info: ddist.DistInfo, loaded, device: str):
        from ript.envs.ray_workers import connect, import_ray

        self.mode = str(cfg.placement.mode)
        if cfg.environment.get("refresh_every"):
            raise RiptError("environment.refresh_every (the two-phase loop) needs placement.mode=collocated: its "
                            "real episodes feed the world model in the rank's own process")
        gpus = float(cfg.placement.rollout_gpus)
        self.check_settings(cfg, device, gpus)
        self.ray = ray = import_ray()
        own = (physical_gpu(torch.device(device).index or 0),) if device.startswith("cuda") else ()
        connect(ray, cfg.workers.ray_address, 1 + (int(cfg.rl.num_workers) if cfg.rl.num_workers != "auto" else 0),
                self.kept_from_ray(cfg, own, gpus))
        actor_class = ray.remote(num_cpus=1, num_gpus=gpus, max_restarts=0)(RolloutActor)
        self.actor = actor_class.remote(self.actor_settings(cfg, own), info, "cuda" if gpus else "cpu", os.getcwd())
        self.timeout_s, self.rank, self.device = float(cfg.workers.timeout_s), info.rank, device
        try:
            described = ray.get(self.actor.describe.remote())
        except ray.exceptions.RayError as e:
            ray.kill(self.actor, no_restart=True)
            raise RiptError(f"placement.mode={self.mode}: the rollout actor of rank {info.rank} failed to start: "
                            f"{one_line(e)}") from None
        same_node = described["node"] == ray.get_runtime_context().get_node_id()
        refused = self.misplaced(cfg, described["gpu"] if same_node else None, own, gpus, info.rank)
        if refused:
            ray.kill(self.actor, no_restart=True)
            raise RiptError(refused)
        try:
            self.backend = channel_backend(cfg.placement.weight_backend,
                                           Endpoint(ray.get_runtime_context().get_node_id(), own[0] if own else None),
                                           Endpoint(described["node"], described["gpu"]))
        except RiptError:
            ray.kill(self.actor, no_restart=True)
            raise
        # every rank's actor, said by the first (the others' console says warnings only)
        line = (f"rollouts of rank {info.rank}: a Ray actor on node {described['node'][:12]} (GPU {described['gpu']}, "
                f"niceness {described['niceness']}) with {described['env_slots']} env slots; weights over "
                f"{self.backend}")
        said = ddist.gather_objects(line, info)
        if info.is_main:
            for each in said:
                log.info("%s", each)
        self.runner = RemoteRunner(self, described)
        self.channel: WeightChannel | None = None
        self.modules: torch.nn.Module | None = None

    @staticmethod
    def check_settings(cfg, device: str, gpus: float) -> None:
        if device.startswith("cuda") and gpus == 0:
            raise RiptError(f"placement.mode={cfg.placement.mode} on a GPU: set placement.rollout_gpus=1 (the "
                            f"rollout actor acts on a GPU of its own, as the rank does), or a share such as 0.5 to "
                            f"put it on a GPU beside other work")

    @staticmethod
    def kept_from_ray(cfg, trainer_gpus: tuple[int, ...], gpus: float) -> tuple[int, ...]:
        """The GPUs a Ray instance this job starts may not hand out: the trainer's, unless the actor shares it."""
        return trainer_gpus if gpus >= 1 else ()

    @staticmethod
    def actor_settings(cfg, trainer_gpus: tuple[int, ...]) -> dict:
        return actor_config(cfg, trainer_gpus)

    @staticmethod
    def misplaced(cfg, actor_gpu: int | None, trainer_gpus: tuple[int, ...], gpus: float, rank: int) -> str | None:
        """Why the GPU Ray gave the actor (None: none, or on another node) cannot work, if it cannot."""
        if gpus >= 1 and actor_gpu is not None and actor_gpu in trainer_gpus:
            return (f"placement.rollout_gpus={gpus:g}: Ray gave the rollout actor of rank {rank} GPU {actor_gpu}, "
                    f"which this rank trains on; start Ray with the GPUs the trainers leave free "
                    f"(CUDA_VISIBLE_DEVICES=<those> ray start --head, docs/distributed.md) or share it "
                    f"(placement.rollout_gpus=0.5)")
        return None

    def attach(self, learner) -> None:
        """The learner whose weights the actor acts with; the channel they travel over."""
        host = self.ray.util.get_node_ip_address()
        store = WeightChannel.listen(host, self.timeout_s)
        joined = self.actor.join.remote(host, store.port, self.timeout_s, self.backend)
        self.channel = WeightChannel(store, 0, self.timeout_s, self.backend, self.device)
        self.call(joined, "join the weight channel")
        self.modules = synced_modules(learner)

    def sync(self, modules: torch.nn.Module | None = None) -> None:
        """The actor acts with ``modules``' weights from now on (default: the learner's, as they are now)."""
        received = self.actor.receive_weights.remote()
        try:
            self.channel.transfer(self.modules if modules is None else modules)
        except RuntimeError:  # the other end went away (gloo says so at once): the actor's answer says why
            self.call(received, "receive the weights")
            raise
        self.call(received, "receive the weights")

    def call(self, ref, what: str) -> Any:
        """An answer of the actor; a dead actor is one line, the run resumable from its last checkpoint."""
        try:
            return self.ray.get(ref)
        except self.ray.exceptions.RayActorError as e:
            raise RiptError(f"placement.mode={self.mode}: the rollout actor of rank {self.rank} died before it "
                            f"could {what} ({one_line(e)}); the run resumes from its last checkpoint with "
                            f"resume=true") from None
        except self.ray.exceptions.RayTaskError as e:
            raise e.as_instanceof_cause() from None

    def close(self) -> None:
        try:
            self.ray.get(self.actor.close.remote(), timeout=30)
        except (self.ray.exceptions.RayError, self.ray.exceptions.GetTimeoutError):
            pass  # already dead or stuck: killed below
        self.ray.kill(self.actor, no_restart=True)


@PLACEMENTS.register("hybrid")
class Hybrid(Disaggregated):
    """``disaggregated`` with the GPUs split by role: the simulators of every rank render on
    ``placement.env_gpus``, the rollout actors act on the others, pipelined in two stages."""

    @staticmethod
    def check_settings(cfg, device: str, gpus: float) -> None:
        env_gpus = list(cfg.placement.get("env_gpus") or [])
        if not device.startswith("cuda"):
            raise RiptError("placement.mode=hybrid splits a host's GPUs between the simulators and the rollout "
                            "actors; on a host without them use placement.mode=disaggregated")
        if not env_gpus:
            raise RiptError("placement.mode=hybrid: set placement.env_gpus to the GPUs the simulators render on, "
                            "e.g. [0] on a host of two (the rollout actors take the others)")
        if gpus <= 0:
            raise RiptError("placement.mode=hybrid: set placement.rollout_gpus to each rollout actor's share of a GPU, "
                            "e.g. 0.5 for two actors on one")

    @staticmethod
    def kept_from_ray(cfg, trainer_gpus: tuple[int, ...], gpus: float) -> tuple[int, ...]:
        return tuple(int(g) for g in cfg.placement.env_gpus)  # where the simulators render

    @staticmethod
    def actor_settings(cfg, trainer_gpus: tuple[int, ...]) -> dict:
        settings = actor_config(cfg, trainer_gpus)
        settings["workers"]["render_gpus"] = [int(g) for g in cfg.placement.env_gpus]
        settings["workers"]["pipeline_stages"] = 2  # one group simulates while the other's decision is made
        return settings

    @staticmethod
    def misplaced(cfg, actor_gpu: int | None, trainer_gpus: tuple[int, ...], gpus: float, rank: int) -> str | None:
        env_gpus = [int(g) for g in cfg.placement.env_gpus]
        if actor_gpu is not None and actor_gpu in env_gpus:
            return (f"placement.mode=hybrid: Ray gave the rollout actor of rank {rank} GPU {actor_gpu}, where the "
                    f"simulators render (placement.env_gpus={env_gpus}); start Ray with the other GPUs only "
                    f"(CUDA_VISIBLE_DEVICES=<those> ray start --head, docs/distributed.md)")
        return None


def rolls_out_remotely(cfg) -> bool:
    """Whether ``placement.mode`` runs the rollouts in actors of their own, with the weights last sent."""
    return placement_kind(cfg).remote


def one_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class RemoteRunner:
    """The ``Runner`` interface over a rollout actor, which acts with the weights last sent (``sync``): each run
    sends the policy's random stream; the stream and the stop rule come back as the actor's run left them."""

    def __init__(self, placement: Disaggregated, described: dict):
        self.placement, self.described = placement, described

    @property
    def env_slots(self) -> int:
        return int(self.described["env_slots"])

    @property
    def shaped_reward(self) -> str | None:
        return self.described["shaped_reward"]

    def specs(self) -> list:
        return self.placement.call(self.placement.actor.specs.remote(), "list its episodes")

    def run(self, policy, video_dir: Path | None = None, specs: list | None = None, stop=None, sink=None) -> dict:
        if sink is not None:
            raise RiptError(f"placement.mode={self.placement.mode} keeps no episode steps for a caller (use "
                            f"collocated)")
        placement = self.placement
        ref = placement.actor.run.remote(policy.generator.get_state(), video_dir, specs, stop)
        packed, generator_state, stop_after, seconds, calls = placement.call(ref, "run its rollouts")
        policy.generator.set_state(generator_state)
        policy.count_inference(seconds, calls)
        if stop is not None:
            vars(stop).update(vars(stop_after))  # the rule's state is its fields, as the episodes left them
        return unpack_episodes(packed, placement.device)

    def close(self) -> None:
        self.placement.close()


def placement_kind(cfg):
    """The class of ``placement.mode`` (an unknown name is one line, before any model loads); built with
    (cfg, info, loaded, device), it has the rank's ``runner``, ``attach(learner)`` and ``sync()``."""
    return PLACEMENTS.get(str(cfg.placement.mode))
