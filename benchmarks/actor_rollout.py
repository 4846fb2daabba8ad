"""The same rollouts driven by this process and by a Ray actor, as ``placement.mode=disaggregated`` drives them: env
steps/s and where the driving process's time went (the policy, waiting for its env workers, its own bookkeeping),
with the actor at the niceness Ray starts its workers at (15) and at the default (0). It tells whether a rollout
actor is slower than the trainer's own process, and whether the niceness is why.

    python -m benchmarks.actor_rollout [--overrides task=metaworld_ml45_10 device=cuda ...] [--tasks 10]
        [--workers 16] [--envs-per-worker 4] [--episodes 256] [--steps 200] [--render-gpu 0] [--actor-gpus 1]
        [--niceness 15,0] [--out f.json]

On a host of two GPUs, ``--render-gpu 1`` keeps the simulators off the GPU both drivers compute on (this process
on GPU 0; Ray gives the actor the first free GPU). The policy is an untrained prior of the configured size built
on one scripted demo per task (a rollout's cost does not depend on the weights), recording its decisions as RL
does; the measured run follows a warm-up run of the same episodes (workers started, tasks built, the CUDA graph
captured).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from omegaconf import OmegaConf

from benchmarks.untrained_prior import demo_dataset, make_prior, prior_sampling
from ript.config import compose, resolve_device, task_names
from ript.envs.runner import EnvRunner, RunnerOptions
from ript.envs.worker_env import PoolSettings
from ript.policies.build import make_policy
from ript.utils.atomic import atomic_write_text

SHARES = ("policy_share", "driver_idle_share", "worker_busy_share")


def measure(a, data_dir: str, niceness: int | None) -> dict:
    """One warm-up and one measured run of the rollouts in this process (at ``niceness``, None: as it is)."""
    import torch

    if niceness is not None:
        os.setpriority(os.PRIO_PROCESS, 0, niceness)
    cfg = compose("stage1", a.overrides)
    device = resolve_device(cfg.device)
    ds = demo_dataset(cfg, Path(data_dir), 1, task_names(cfg.task)[: a.tasks])
    model = make_prior(cfg, ds).to(device)
    settings = prior_sampling(cfg)
    policy = make_policy(model, settings, device, seed=0)
    policy.start_recording()
    render = None if a.render_gpu is None else (a.render_gpu,)
    runner = EnvRunner(RunnerOptions(str(cfg.task.suite), ds.task_names, OmegaConf.to_container(cfg.task.render),
                                     a.steps, max(1, a.episodes // len(ds.task_names)), num_workers=a.workers,
                                     envs_per_worker=a.envs_per_worker, pool=PoolSettings(render_gpus=render)))
    try:
        runner.run(policy)
        result = runner.run(policy)
    finally:
        runner.close()
    return {"env_steps_per_s": result["env_steps_per_second"], "seconds": result["seconds"],
            "pipeline_stages": result["pipeline_stages"], **{k: result[k] for k in SHARES},
            "niceness": os.getpriority(os.PRIO_PROCESS, 0), "torch_threads": torch.get_num_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


class RolloutsInAnActor:
    def run(self, a, data_dir: str, niceness: int | None) -> dict:
        return measure(a, data_dir, niceness)


def in_actor(a, data_dir: str, niceness: int | None) -> dict:
    import ray

    if not ray.is_initialized():
        ray.init(address="local", include_dashboard=False, log_to_driver=False, configure_logging=False)
    cls = ray.remote(num_cpus=1, num_gpus=a.actor_gpus, max_restarts=0)(RolloutsInAnActor)
    actor = cls.remote()
    try:
        return ray.get(actor.run.remote(a, data_dir, niceness))
    finally:
        ray.kill(actor)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--overrides", nargs="*", default=["task=metaworld_ml45_10", "device=cuda"])
    ap.add_argument("--tasks", type=int, default=10)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--envs-per-worker", type=int, default=4)
    ap.add_argument("--episodes", type=int, default=256)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--render-gpu", type=int, default=None, help="the host's GPU the simulators render on")
    ap.add_argument("--actor-gpus", type=float, default=1.0, help="the actor's GPUs (0 on a CPU host)")
    ap.add_argument("--niceness", default="15,0", help="the actor's niceness in each actor run (15: Ray's)")
    ap.add_argument("--out")
    a = ap.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as data_dir:
        rows["this process"] = measure(a, data_dir, None)
        print("this process", json.dumps(rows["this process"]), flush=True)
        for nice in (int(n) for n in a.niceness.split(",") if n):
            rows[f"Ray actor, niceness {nice}"] = in_actor(a, data_dir, nice)
            print(f"Ray actor, niceness {nice}", json.dumps(rows[f"Ray actor, niceness {nice}"]), flush=True)
    for name, row in rows.items():
        print(f"{name:>24}: {row['env_steps_per_s']:7.0f} env steps/s, policy {row['policy_share']:.0%}, driver idle "
              f"{row['driver_idle_share']:.0%}, workers busy {row['worker_busy_share']:.0%}, "
              f"{row['pipeline_stages']} stage(s)")
    if a.out:
        atomic_write_text(Path(a.out), json.dumps({"args": vars(a), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
