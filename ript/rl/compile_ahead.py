"""Compiling the RL update while the first rollouts run (``rl.compile_ahead``).

A compiled update (``rl.compile``) spends a minute or more compiling at the first iteration's update, after its
rollouts (63.5 s on LIBERO-Goal's first update on an H200, 95 s on ML45's on an H100). A fresh run therefore
starts a second process at once that loads the same checkpoint with the same settings, rolls out two short
episodes on one env worker and runs one update on them: the same compiled forward and backward, at the same
padded micro-batch shape. What it compiles lands in the compiler's on-disk caches of this host, so the run's own
first update, which waits for that process first, finds its graphs and kernels there. The process trains
nothing the run keeps and writes nothing but those caches.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import torch
from omegaconf import OmegaConf

from ript.config import to_dict
from ript.utils.logging import log

# decisions: 2 episodes of this many env steps give every one of rl.minibatches (4 by default) at least one
# decision for any action horizon up to 16
WARM_EPISODE_STEPS = 64


def wanted(cfg, compiles_update: bool, world_size: int, cache_loaded: bool) -> bool:
    """When the update compiles, its rollouts run in the run's own processes and no compile cache was loaded (a
    resumed run has its own): ``auto`` in a run of one process, ``true`` under torchrun too (each rank then
    starts its own second process, on its own GPU)."""
    setting = cfg.rl.get("compile_ahead", "auto")
    if setting is False or not compiles_update or cache_loaded or str(cfg.placement.mode) != "collocated":
        return False
    return world_size == 1 or setting is True


def warm_config(cfg) -> dict:
    """The run's settings, cut to one group of two short rollouts on one env worker, without evaluation."""
    warm = OmegaConf.create(to_dict(cfg))
    warm.rl.update({"iterations": 1, "groups_per_iteration": 1, "rollouts_per_group": 2, "max_sampling_rounds": 1,
                    "max_episode_steps": WARM_EPISODE_STEPS, "num_workers": 1, "video_every": 0,
                    "compile_ahead": False, "stop_after_minutes": None, "max_env_steps": None})
    warm.eval.every = 0
    warm.workers.envs_per_worker = 1
    warm.resume = False
    return to_dict(warm)


class CompileAhead:
    """The second process: started with the run, waited for before the run's first update."""

    def __init__(self, cfg, device: str):
        self.t0 = time.perf_counter()
        # the longest the run waits at its first update: about what compiling the update itself takes on a GPU
        # host (63.5-95 s), so a second process that stalls costs the run at most this
        self.wait_limit_s = float(cfg.rl.compile_ahead_wait_s)
        self.proc = mp.get_context("spawn").Process(target=_warm, args=(warm_config(cfg), device),
                                                     name="ript-compile-ahead")
        self.proc.start()
        log.info("rl: compiling the update ahead in process %d while the first rollouts run", self.proc.pid)

    def wait(self) -> float:
        """Waits for the process, at most ``rl.compile_ahead_wait_s``; returns the seconds waited."""
        t = time.perf_counter()
        self.proc.join(self.wait_limit_s)
        waited = time.perf_counter() - t
        if self.proc.is_alive():
            log.warning("rl: the update compiling ahead was not ready after %.0f s more; the run compiles it itself",
                        waited)
        elif self.proc.exitcode != 0:
            log.warning("rl: compiling the update ahead failed (exit code %s); the run compiles it itself",
                        self.proc.exitcode)
        else:
            log.info("rl: the update compiled ahead in %.0f s (%.1f s of it waited for)",
                     time.perf_counter() - self.t0, waited)
        self.close()
        return waited

    def report(self) -> None:
        """After the run's first update: what its compile found in the caches and what it compiled itself."""
        from torch._dynamo.utils import counters

        found, compiled = (counters["inductor"].get(k, 0) for k in ("fxgraph_cache_hit", "fxgraph_cache_miss"))
        # every rank says when it had to compile (under torchrun the others log only warnings)
        (log.warning if compiled else log.info)(
            "rl: the first update found %d compiled graphs in the compiler's caches and compiled %d", found, compiled)

    def close(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)


def _warm(cfg_dict: dict[str, Any], device: str) -> None:
    """The second process: the run's policy, learner and runner as ``ript rl`` builds them, two rollouts of one
    initial condition, and one update on their decisions (advantages set to one: two failures would give none)."""
    from ript.envs.seeds import rl_layout_seed
    from ript.envs.worker_env import EpisodeSpec
    from ript.policies.families import family_for
    from ript.rl.advantages import build_estimator
    from ript.rl.placement import critic_settings, placement_kind
    from ript.rl.update import make_optimizer, ppo_update, reference_state, update_batch
    from ript.utils.distributed import DistInfo
    from ript.utils.processes import die_with_parent, ranks_on_this_host

    die_with_parent()
    if device.startswith("cuda"):
        # a spawned process starts on cuda:0: under torchrun, rank 1's second process must capture its graphs and
        # render on rank 1's GPU (init_rank does this for the ranks themselves); plain "cuda" is the current one
        index = torch.device(device).index
        torch.cuda.set_device(0 if index is None else index)
    cfg = OmegaConf.create(cfg_dict)
    info = DistInfo(local_world_size=ranks_on_this_host())  # its driver threads: this rank's share of the cores
    family = family_for(cfg)
    loaded = family.load(cfg, device, int(cfg.seed), rl=True)
    placement = placement_kind(cfg)(cfg=cfg, info=info, loaded=loaded, device=device)
    try:
        learner = family.learner(loaded, cfg, device, critic_settings(cfg))
        placement.attach(learner)
        learner.attach(loaded.policy)
        specs = [EpisodeSpec(loaded.task_names[0], rl_layout_seed(0), j) for j in range(2)]
        episodes = placement.runner.run(loaded.policy, specs=specs)["episodes"]
        data, _ = update_batch(learner, [episodes], build_estimator(cfg.rl), cfg, device, info)
        data["advantages"] = torch.ones_like(data["advantages"])
        opt, sched = make_optimizer(learner, cfg, device)
        ppo_update(learner, opt, sched, data, cfg, info, 0, device, reference_state(learner, cfg), False)
    finally:
        placement.runner.close()
