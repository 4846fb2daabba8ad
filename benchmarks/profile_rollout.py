"""Where a rollout's time goes: the policy call inside the env runner against the same call in isolation.

    python -m benchmarks.profile_rollout [--workers 16] [--episodes 32] [--steps 100] [--out DIR]

Runs an untrained prior of the configured size through the runner (recording, as RL does; CUDA graph on
or off), times every ``plan()`` with the GPU synchronised, optionally profiles one run with torch.profiler,
and times ``plan()`` on real observations at the same batch sizes with the workers alive and after they close.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from benchmarks.bench import demo_dataset, make_prior
from ript.config import compose, resolve_device
from ript.envs.runner import EnvRunner
from ript.policies.build import make_policy


def timed_plans(policy, log: list) -> None:
    """Wrap ``policy.plan`` so every call's batch size and synchronised wall time land in ``log``."""
    inner = policy.plan

    def plan(envs):
        sync = torch.cuda.synchronize if policy.device.type == "cuda" else (lambda: None)
        sync()
        t = time.perf_counter()
        chunks = inner(envs)
        sync()
        log.append((len(envs), time.perf_counter() - t))
        return chunks

    policy.plan = plan


def isolated_plan_ms(policy, obs_example: dict, n: int, repeat: int = 20) -> float:
    policy.reset(n)
    for i in range(n):
        policy.reset_env(i, policy.model.task_names[0], i)
        policy.observe(i, obs_example)
    sync = torch.cuda.synchronize if policy.device.type == "cuda" else (lambda: None)
    times = []
    for r in range(repeat + 3):
        sync()
        t = time.perf_counter()
        policy.plan(list(range(n)))
        sync()
        if r >= 3:
            times.append(time.perf_counter() - t)
    return 1000 * float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--overrides", nargs="*", default=[])
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--envs-per-worker", type=int, default=1)
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--record", type=int, default=1)
    ap.add_argument("--cuda-graph", type=int, default=1)
    ap.add_argument("--torch-profile", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cfg = compose("stage1", args.overrides)
    device = resolve_device(cfg.device)
    out: dict = {"workers": args.workers, "envs_per_worker": args.envs_per_worker, "episodes": args.episodes, "horizon": args.steps}
    with tempfile.TemporaryDirectory() as tmp:
        ds = demo_dataset(cfg, Path(tmp), 2)
        model = make_prior(cfg, ds).to(device)
    settings = {"action_horizon": int(cfg.algo.action_horizon), **OmegaConf.to_container(cfg.algo.sampling)}
    policy = make_policy(model, settings, device, seed=0)
    policy.record = bool(args.record)
    policy.cuda_graph = policy.cuda_graph and bool(args.cuda_graph)
    out["cuda_graph"] = policy.cuda_graph
    per_task = max(1, args.episodes // len(ds.task_names))
    runner = EnvRunner("metaworld", ds.task_names, dict(cfg.task.render), args.steps, per_task,
                       num_workers=args.workers, envs_per_worker=args.envs_per_worker)
    runner.run(policy)  # warm-up: spawn workers, build envs, first kernels
    log: list = []
    timed_plans(policy, log)
    policy.inference_seconds = 0.0
    res = runner.run(policy)
    sizes = sorted({n for n, _ in log})
    out["runner"] = {"seconds": res["seconds"], "inference_share": sum(t for _, t in log) / res["seconds"], "env_steps_per_s": res["env_steps_per_second"],
                     "worker_busy_share": res["worker_busy_share"], "policy_share": res["policy_share"],
                     "plan_calls": len(log), "plan_s_total": sum(t for _, t in log),
                     "plan_ms_by_batch": {n: 1000 * float(np.median([t for m, t in log if m == n])) for n in sizes}}
    print(json.dumps(out["runner"], indent=2), flush=True)
    policy.plan = type(policy).plan.__get__(policy)
    if device.startswith("cuda") and args.torch_profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            runner.run(policy)
        table_cpu = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
        table_cuda = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15)
        print(table_cpu, "\n", table_cuda, flush=True)
        if args.out:
            Path(args.out, "profile_tables.txt").write_text(table_cpu + "\n\n" + table_cuda)
    from ript.envs.metaworld import MetaWorldTask, RenderSettings

    task = MetaWorldTask(ds.task_names[0], RenderSettings.from_dict(dict(cfg.task.render)), args.steps)
    obs = task.reset(0, render=True)
    out["isolated_workers_alive_ms"] = {n: isolated_plan_ms(policy, obs, n) for n in sizes}
    runner.close()
    out["isolated_workers_closed_ms"] = {n: isolated_plan_ms(policy, obs, n) for n in sizes}
    task.close()
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        Path(args.out, "profile_rollout.json").write_text(text)


if __name__ == "__main__":
    main()
