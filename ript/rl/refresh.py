"""The two-phase loop of RL in a world model (``environment.refresh_every``): every N iterations the current policy
runs ``environment.refresh_episodes`` real episodes per task in the simulator; they join the world model's data
(its demos and every earlier refresh's episodes) and the world model trains ``environment.refresh_steps`` more
steps from where it was (and where RL started in a world model whose success head learnt on its own imagination,
``ript world-model-head``, the refreshed model's head learns so again, with the same settings, on all of that
data); RL's rollouts then go on in the refreshed model. The real env steps are counted apart.

A refresh is a folder of the RL run (``world_model_refresh/iterNNNNN``: the episodes, the world model, and
``refresh.json`` once complete), made before that iteration's rollouts; a resumed run reuses a complete one and
makes an incomplete one again, with the policy's and the global random streams left as they were, so resuming
gives the run an uninterrupted one gives."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from omegaconf import OmegaConf

from ript.config import compose, override
from ript.envs.imagination import ImaginedRunner
from ript.envs.suites import get_suite
from ript.envs.worker_env import EpisodeSpec
from ript.errors import RiptError
from ript.evaluation.recording import EpisodeFiles
from ript.evaluation.runner import runner_from_metadata
from ript.model_loader import load_model
from ript.policies.base import ChunkingPolicy
from ript.utils.atomic import atomic_write_text
from ript.utils.checkpoint import read_checkpoint_config, resolve_checkpoint_dir
from ript.utils.logging import log
from ript.utils.run_dir import with_added_settings
from ript.utils.seeding import rng_state, set_rng_state

# layout seeds of the real episodes: apart from the demos' and RL's own draws (LIBERO takes them modulo its 50
# init states)
REFRESH_SEEDS = 1_500_000_000
DONE_FILE = "refresh.json"


class WorldModelRefresh:
    def __init__(self, cfg, run_dir: Path, metadata: dict, task_names: list[str], device: str, world_size: int,
                 train_world_model: Callable, train_head: Callable):
        env = cfg.environment
        if world_size > 1:
            raise RiptError("environment.refresh_every: a refreshed world model is trained by one process; run RL "
                            "in a world model that refreshes on one GPU")
        self.every, self.episodes, self.steps = int(env.refresh_every), int(env.refresh_episodes), \
            int(env.refresh_steps)
        self.cfg, self.metadata, self.names, self.device = cfg, metadata, list(task_names), device
        self.folder = Path(run_dir) / "world_model_refresh"
        self.base = str(env.checkpoint)
        self.simulator = None  # the env runner of the real episodes, built at the first refresh
        self.train_world_model = train_world_model  # ``ript world-model``'s run(cfg)
        self.train_head = train_head  # ``ript world-model-head``'s run(cfg)
        self.real_env_steps = 0

    def due(self, iteration: int) -> bool:
        return iteration > 0 and iteration % self.every == 0

    def folder_of(self, iteration: int) -> Path:
        return self.folder / f"iter{iteration:05d}"

    def complete(self, iteration: int) -> bool:
        return (self.folder_of(iteration) / DONE_FILE).is_file()

    def world_model_before(self, iteration: int) -> str:
        """The world model in use before ``iteration``: the last complete refresh before it, else the first."""
        done = [k for k in range(self.every, iteration, self.every) if self.complete(k)]
        return str(self.folder_of(done[-1]) / "world_model") if done else self.base

    def resume(self, start: int, runner: ImaginedRunner, real_env_steps: int) -> None:
        self.real_env_steps = real_env_steps
        if start > 0:
            runner.use_model(load_model(self.world_model_before(start), "world_model", self.device)[0])

    def refresh(self, iteration: int, policy: ChunkingPolicy, runner: ImaginedRunner) -> None:
        out = self.folder_of(iteration)
        if not self.complete(iteration):
            shutil.rmtree(out, ignore_errors=True)
            streams = rng_state(), policy.generator.get_state()
            try:
                steps = self.real_episodes(iteration, policy, out / "episodes")
                self.train(iteration, out)
            finally:  # the rollouts and the training draw from nothing RL's own streams go on with
                set_rng_state(streams[0])
                policy.generator.set_state(streams[1])
            atomic_write_text(out / DONE_FILE, json.dumps({"iteration": iteration, "real_env_steps": steps}))
        steps = int(json.loads((out / DONE_FILE).read_text())["real_env_steps"])
        self.real_env_steps += steps
        runner.use_model(load_model(out / "world_model", "world_model", self.device)[0])
        log.info("rl iteration %d: world model refreshed on %d real env steps (%d so far)", iteration, steps,
                 self.real_env_steps)

    def real_episodes(self, iteration: int, policy: ChunkingPolicy, folder: Path) -> int:
        """The current policy's episodes in the simulator, kept as demonstration files; their env steps."""
        if self.simulator is None:
            self.simulator = runner_from_metadata(self.metadata, self.names, self.cfg.workers, episodes_per_task=1,
                                                  num_workers=self.cfg.rl.num_workers,
                                                  max_episode_steps=self.cfg.rl.max_episode_steps)
        specs = [EpisodeSpec(task, REFRESH_SEEDS + 1000 * iteration + j, j, keep=True)
                 for j in range(self.episodes) for task in self.names]
        files = EpisodeFiles(folder, self.metadata, get_suite(self.metadata["suite"]).instructions(self.names))
        results = self.simulator.run(policy, specs=specs, sink=files)
        files.finish()
        wins = sum(e["success"] for e in results["episodes"])
        log.info("rl iteration %d: %d real episodes for the world model, %d successful", iteration,
                 len(results["episodes"]), wins)
        return int(results["env_steps"])

    def train(self, iteration: int, out: Path) -> None:
        """The world model goes on from the one in use, on its data and every refresh's episodes so far."""
        current = self.world_model_before(iteration)
        base = read_checkpoint_config(resolve_checkpoint_dir(self.base))
        recorded, head = base["cfg"], base["metadata"].get("success_head")
        cfg = OmegaConf.create(with_added_settings(recorded))  # a model older than a setting trains as it did
        dirs = [str(self.folder_of(k) / "episodes") for k in range(self.every, iteration, self.every)]
        cfg.data.extra_dirs = [*list(recorded.get("data", {}).get("extra_dirs") or []), *dirs,
                               str(out / "episodes")]
        trained = out / ("world_model_dynamics" if head else "world_model")
        cfg.run_dir, cfg.init_checkpoint, cfg.resume, cfg.progress = str(trained), current, False, False
        cfg.device = self.device
        cfg.train.steps = self.steps
        cfg.train.warmup_steps = 0  # it goes on: no second warm-up
        # the sampling steps of the model it goes on from (its head may have been trained on frames drawn in others)
        drawn_in = read_checkpoint_config(resolve_checkpoint_dir(current))["model_kwargs"].get("denoise_steps")
        if drawn_in is not None:
            cfg.algo.model.denoise_steps = drawn_in
        cfg.train.stop_after_minutes = None
        self.train_world_model(cfg)
        if head:  # trained on real frames again, the head learns on the refreshed model's imagination again
            head_cfg = compose("world_model_head", [override("checkpoint", trained),
                                                    override("run_dir", out / "world_model"), f"device={self.device}"])
            for key, value in {**head["settings"], "episodes_dirs": head["episodes_dirs"]}.items():
                head_cfg[key] = value
            self.train_head(head_cfg)

    def close(self) -> None:
        if self.simulator is not None:
            self.simulator.close()
            self.simulator = None
