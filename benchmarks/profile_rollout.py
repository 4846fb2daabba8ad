"""Where a rollout's time goes: the policy call inside the env runner against the same call in isolation, and
against the same call while simulator processes load the host (physics only, or physics and rendering).

    python -m benchmarks.profile_rollout [--overrides task=libero_object ...] [--workers 16] [--episodes 32]
                                         [--pipeline-stages auto] [--decisions lockstep] [--runner-only 0]
                                         [--steps 100] [--load-procs 16] [--driver-threads N] [--out DIR]

Builds an untrained prior of the configured size on one scripted demo per task of the configured suite (the
model's cost does not depend on its weights), runs it through the runner (recording, as RL does; CUDA graph on or
off), times every ``plan()`` with the GPU synchronised (and the GPU's own time of each call, from CUDA events),
optionally profiles one run with torch.profiler, then times ``plan()`` on real observations at the same batch
sizes: with the workers alive and idle, after they close, and while ``--load-procs`` processes step the suite's
first task without rendering, then stepping and rendering. Which of those matches the in-runner figure says
whether the call is slow by itself, for want of CPU, or because the renderers' EGL contexts share the GPU.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from benchmarks.untrained_prior import demo_dataset, make_prior, prior_sampling
from ript.config import compose, resolve_device, task_names
from ript.envs.runner import EnvRunner, RunnerOptions
from ript.envs.suites import get_suite
from ript.policies.build import make_policy
from ript.utils.processes import driver_threads, usable_cores


def timed_plans(policy, log: list) -> None:
    """Wrap ``policy.plan`` so every call's batch size, synchronised wall time and GPU time land in ``log``."""
    inner = policy.plan
    cuda = policy.device.type == "cuda"

    def plan(envs):
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t = time.perf_counter()
        chunks = inner(envs)
        gpu_ms = 0.0
        if cuda:
            end.record()
            torch.cuda.synchronize()
            gpu_ms = start.elapsed_time(end)
        log.append((len(envs), time.perf_counter() - t, gpu_ms / 1000))
        return chunks

    policy.plan = plan


def isolated_plan_ms(policy, task_name: str, obs_example: dict, n: int, repeat: int = 20) -> float:
    policy.reset(n)
    for i in range(n):
        policy.reset_env(i, task_name, i)
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


def load_loop(suite: str, task_name: str, render: dict, action_dim: int, with_render: bool, ready, stop, steps) -> None:
    """A background simulator process: step ``task_name`` (rendering or not) until told to stop."""
    task = get_suite(suite).make_task(task_name, render, 10**9)
    task.reset(0, render=with_render)
    ready.release()
    action, n = np.zeros(action_dim, dtype=np.float32), 0
    while not stop.is_set():
        task.step(action, render=with_render)
        n += 1
        if n % 100 == 0:
            task.reset(n, render=with_render)
    steps.value = n
    task.close()


def plan_ms_under_load(policy, cfg, task_name: str, obs: dict, sizes: list[int], procs: int, with_render: bool) -> dict:
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Semaphore(0), ctx.Event()
    counters = [ctx.Value("l", 0) for _ in range(procs)]
    args = (str(cfg.task.suite), task_name, OmegaConf.to_container(cfg.task.render), int(cfg.task.action_dim),
            with_render)
    workers = [ctx.Process(target=load_loop, args=(*args, ready, stop, c), daemon=True) for c in counters]
    for w in workers:
        w.start()
    for _ in workers:
        ready.acquire()
    t = time.perf_counter()
    ms = {n: isolated_plan_ms(policy, task_name, obs, n) for n in sizes}
    seconds = time.perf_counter() - t
    stop.set()
    for w in workers:
        w.join(60)
    if any(w.exitcode != 0 for w in workers):  # a dead load process would make the figure a no-load one
        raise SystemExit(f"profile_rollout: load processes exited with {[w.exitcode for w in workers]}")
    return {"plan_ms": ms, "load_env_steps_per_s": sum(c.value for c in counters) / seconds}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--overrides", nargs="*", default=[])
    ap.add_argument("--tasks", type=int, default=2, help="the suite's first N tasks")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--envs-per-worker", type=int, default=1)
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--record", type=int, default=1)
    ap.add_argument("--cuda-graph", type=int, default=1)
    ap.add_argument("--torch-profile", type=int, default=0)
    ap.add_argument("--driver-threads", type=int, default=None,
                    help="torch threads of the driving process during runs (default: the runner's, the cores "
                         "its workers leave; the number of cores: torch's own default, as ript had it before)")
    ap.add_argument("--pipeline-stages", default="auto", help="groups of workers planned in turn (the runner's)")
    ap.add_argument("--decisions", default="lockstep", choices=["lockstep", "as_ready"],
                    help="when a group's waiting workers are planned (the runner's)")
    ap.add_argument("--runner-only", type=int, default=0, help="1: time the runner alone, not the isolated calls")
    ap.add_argument("--load-procs", type=int, default=0, help="background simulator processes (0: skip)")
    ap.add_argument("--out", default=None)
    return ap.parse_args()


def timed_run(runner: EnvRunner, policy) -> tuple[dict, list[int]]:
    """One run with every ``plan()`` timed: the runner's figures and the batch sizes the policy saw."""
    log: list = []
    timed_plans(policy, log)
    res = runner.run(policy)
    policy.plan = type(policy).plan.__get__(policy)  # untimed again
    sizes = sorted({n for n, _, _ in log})
    median_ms = lambda col, n: 1000 * float(np.median([row[col] for row in log if row[0] == n]))  # noqa: E731
    return {"seconds": res["seconds"], "inference_share": sum(r[1] for r in log) / res["seconds"],
            "env_steps_per_s": res["env_steps_per_second"], "worker_busy_share": res["worker_busy_share"],
            "policy_share": res["policy_share"], "plan_calls": len(log), "plan_s_total": sum(r[1] for r in log),
            "plan_ms_by_batch": {n: median_ms(1, n) for n in sizes},
            "plan_gpu_ms_by_batch": {n: median_ms(2, n) for n in sizes}}, sizes


def torch_profile(runner: EnvRunner, policy, out_dir: str | None) -> None:
    """One more run under torch.profiler: the top CPU and CUDA ops, printed (and written to ``out_dir``)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        runner.run(policy)
    table_cpu = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    table_cuda = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15)
    print(table_cpu, "\n", table_cuda, flush=True)
    if out_dir:
        Path(out_dir, "profile_tables.txt").write_text(table_cpu + "\n\n" + table_cuda)


def isolated_calls(args, cfg, policy, runner: EnvRunner, task_name: str, sizes: list[int]) -> dict:
    """``plan()`` on a real observation at the runner's batch sizes: with its workers alive and idle, after they
    close (this closes the runner), and under ``--load-procs`` simulator processes."""
    task = get_suite(str(cfg.task.suite)).make_task(task_name, OmegaConf.to_container(cfg.task.render), args.steps)
    obs = task.reset(0, render=True)
    task.close()
    out = {"isolated_workers_alive_ms": {n: isolated_plan_ms(policy, task_name, obs, n) for n in sizes}}
    runner.close()
    out["isolated_workers_closed_ms"] = {n: isolated_plan_ms(policy, task_name, obs, n) for n in sizes}
    if args.load_procs:
        for with_render in (False, True):
            key = f"isolated_under_{args.load_procs}_procs_{'rendering' if with_render else 'physics_only'}"
            with driver_threads(args.load_procs, args.driver_threads):  # as the runner does with its workers
                out[key] = plan_ms_under_load(policy, cfg, task_name, obs, sizes, args.load_procs, with_render)
            print(key, out[key], flush=True)
    return out


def main() -> None:
    args = parse_args()
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    cfg = compose("stage1", args.overrides)
    device = resolve_device(cfg.device)
    suite = str(cfg.task.suite)
    out: dict = {"suite": suite, "overrides": args.overrides, "workers": args.workers,
                 "envs_per_worker": args.envs_per_worker, "episodes": args.episodes, "horizon": args.steps,
                 "driver_threads": args.driver_threads, "cores": usable_cores(),
                 "pipeline_stages": args.pipeline_stages, "decisions": args.decisions}
    with tempfile.TemporaryDirectory() as tmp:
        ds = demo_dataset(cfg, Path(tmp), 1, task_names(cfg.task)[: args.tasks])
        model = make_prior(cfg, ds).to(device)
    policy = make_policy(model, prior_sampling(cfg), device, seed=0)
    if args.record:
        policy.start_recording()
    policy.cuda_graph = policy.cuda_graph and bool(args.cuda_graph)
    out["cuda_graph"] = policy.cuda_graph
    per_task = max(1, args.episodes // len(ds.task_names))
    runner = EnvRunner(RunnerOptions(suite, ds.task_names, OmegaConf.to_container(cfg.task.render), args.steps,
                       per_task, num_workers=args.workers, envs_per_worker=args.envs_per_worker,
                       driver_threads=args.driver_threads,
                       pipeline_stages=args.pipeline_stages if args.pipeline_stages == "auto"
                       else int(args.pipeline_stages), decisions=args.decisions))
    runner.run(policy)  # warm-up: spawn workers, build envs, first kernels
    out["runner"], sizes = timed_run(runner, policy)
    print(json.dumps(out["runner"], indent=2), flush=True)
    if device.startswith("cuda") and args.torch_profile:
        torch_profile(runner, policy, args.out)
    if args.runner_only:
        runner.close()
    else:
        out.update(isolated_calls(args, cfg, policy, runner, ds.task_names[0], sizes))
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        Path(args.out, "profile_rollout.json").write_text(text)


if __name__ == "__main__":
    main()
