"""Speed of one RL iteration: rollout time, training time, env-steps/s, the policy's share of rollout time,
and rollout throughput against the number of env workers.

    python benchmarks/bench_rl.py [--overrides ...] [--workers 1,2,4] [--envs-per-worker 1] [--groups 8] [--k 8]
        [--steps 100] [--plan-alone] [--backend processes|ray] [--ray-address auto]

``--plan-alone`` times the schedule recording runs had before the chunk policy's fixed batch layout: every
env's decision planned in a call of its own.

Uses an untrained prior of the configured size (speed does not depend on the weights; every episode runs
to the horizon, the slowest case).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.untrained_prior import demo_dataset, make_prior, prior_sampling
from ript.config import compose, resolve_device
from ript.envs.runner import EnvRunner, RunnerOptions
from ript.envs.worker_env import PoolSettings
from ript.policies.build import make_policy
from ript.policies.chunk_policy import ChunkPolicy
from ript.rl.advantages import build_estimator
from ript.rl.learners import ChunkLearner
from ript.rl.rollout import GroupSampling, collect_groups, group_episodes
from ript.rl.sampler import InitialConditionSampler
from ript.rl.update import ppo_update, update_batch
from ript.utils.distributed import DistInfo


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--overrides", nargs="*", default=[])
    ap.add_argument("--workers", default=None)
    ap.add_argument("--envs-per-worker", type=int, default=1)
    ap.add_argument("--plan-alone", action="store_true", help="each env's decision in a call of its own")
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--steps", type=int, default=100, help="episode horizon")
    ap.add_argument("--backend", default="processes", choices=["processes", "ray"], help="workers.backend")
    ap.add_argument("--ray-address", default=None, help="workers.ray_address (default: Ray started here)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cfg = compose("stage1", args.overrides)
    device = resolve_device(cfg.device)
    cores = os.cpu_count() or 1
    workers = [int(w) for w in args.workers.split(",")] if args.workers else sorted(
        {min(cores, 2**i) for i in range(8) if 2**i <= cores} | {cores})
    pool = PoolSettings(backend=args.backend, address=args.ray_address)
    out = bench_rl(cfg, workers, device, args.groups, args.k, args.steps, args.envs_per_worker, args.plan_alone, pool)
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


class PlannedAlone(ChunkPolicy):
    """A chunk policy without the fixed batch layout: a recording run then plans each env alone."""

    @property
    def fixed_layout(self) -> bool:
        return False


def bench_rl(cfg, workers: list[int], device: str, groups: int, k: int, horizon: int, envs_per_worker: int = 1,
             plan_alone: bool = False, pool: PoolSettings | None = None) -> dict:
    """One RL iteration per worker count (after a warm-up one): rollout and training seconds, env-steps/s."""
    pool = pool or PoolSettings()
    rl_cfg = compose("rl", [f"rl.groups_per_iteration={groups}", f"rl.rollouts_per_group={k}",
                            "rl.max_sampling_rounds=1", "rl.oversample=1"])
    cores = os.cpu_count() or 1
    out: dict = {"device": torch.cuda.get_device_name() if device.startswith("cuda") else f"cpu x{cores}",
                 "groups": groups, "k": k, "horizon": horizon,
                 "envs_per_worker": envs_per_worker, "plan_alone": plan_alone, "backend": pool.backend,
                 "per_workers": {}}
    with tempfile.TemporaryDirectory() as tmp:
        ds = demo_dataset(cfg, Path(tmp), 2)
        model = make_prior(cfg, ds).to(device)
        settings = prior_sampling(cfg)
        learner = ChunkLearner(model, settings, prior_only=True)
        opt = torch.optim.AdamW(learner.params, lr=1e-5)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: 1.0)
        sampling = GroupSampling.from_config(rl_cfg.rl)
        for w in workers:
            runner = EnvRunner(RunnerOptions("metaworld", ds.task_names, dict(cfg.task.render), horizon, 1,
                               num_workers=w, envs_per_worker=envs_per_worker,
                               episodes_at_once=sampling.most_episodes_per_round(1), pool=pool))
            policy = make_policy(model, settings, device, seed=0)
            if plan_alone:
                policy.__class__ = PlannedAlone  # the same policy, only its batch layout differs
            policy.start_recording()
            sampler = InitialConditionSampler(ds.task_names, seed=0)
            collect_groups(runner, policy, sampler, sampling, DistInfo())  # warm-up: spawn workers, build envs
            policy.inference_seconds = 0.0
            t = time.perf_counter()
            batch = collect_groups(runner, policy, sampler, sampling, DistInfo())
            t_rollout = time.perf_counter() - t
            runner.close()
            # time training on every group, informative or not
            data, _ = update_batch(learner, group_episodes(batch["episodes"], k), build_estimator(rl_cfg.rl), rl_cfg,
                                   device, DistInfo())
            data["advantages"] = torch.randn(len(data["advantages"]), device=device)
            t = time.perf_counter()
            ppo_update(learner, opt, sched, data, rl_cfg, DistInfo(), 0, device)
            t_train = time.perf_counter() - t
            steps = sum(e["length"] for e in batch["episodes"])
            out["per_workers"][w] = {"rollout_s": t_rollout, "train_s": t_train, "env_steps": steps,
                                     "env_steps_per_s": steps / t_rollout,
                                     "inference_share": policy.inference_seconds / t_rollout,
                                     "decisions": len(data["tokens"])}
            print(f"workers {w}: {steps / t_rollout:.0f} env-steps/s, rollout {t_rollout:.1f} s, "
                  f"train {t_train:.2f} s, "
                  f"policy {100 * policy.inference_seconds / t_rollout:.0f}% of rollout", flush=True)
    base = out["per_workers"][workers[0]]["env_steps_per_s"] / workers[0]
    for w, r in out["per_workers"].items():
        r["scaling_vs_linear"] = r["env_steps_per_s"] / (base * w)
    return out


if __name__ == "__main__":
    main()
