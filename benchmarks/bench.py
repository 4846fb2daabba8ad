"""Speed of the staged pipeline on whatever machine runs it, in one report.

    python -m benchmarks.bench [--only data,train,compiled,sample,sim,floor,collect,eval,rl] [--workers 1,2,4]
                               [--out benchmarks/results/<machine>_bench.json]

Prints: dataset samples/s; stage-0 and stage-1 training samples/s (eager, and on a GPU fp32 / bf16 / the
compiled CUDA-graph step of `benchmarks/train_speed.py`); prior sampling and policy latency for a batch of 64;
the simulator floor per core (one physics step, one rendered frame); env-steps/s of collection, evaluation and
RL rollouts against the number of workers, with the RL iteration's split (rollout, training, policy share);
then one table of every figure against its floors — the per-core simulator rate times the workers, and the
rate that many processes reach stepping and rendering at once (on a GPU host they share one EGL device) — and
the targets set for one H100 host. Several GPUs: \
`benchmarks/gpu_scaling.sh` (torchrun) measures stage 1 and RL on 1 and N.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.untrained_prior import TASKS, demo_dataset, make_prior
from ript.config import compose, resolve_device
from ript.data.dataset import ChunkDataset
from ript.envs.metaworld import MetaWorldTask, RenderSettings, expert_policy
from ript.models.action_autoencoder import ActionAutoencoder
from ript.stages.stage0 import autoencoder_kwargs
from ript.utils import training


def timed(fn, repeat: int, warmup: int = 2, sync: bool = False) -> float:
    for _ in range(warmup):
        fn()
    if sync:
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(repeat):
        fn()
    if sync:
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / repeat


def bench_data(ds: ChunkDataset, batch: int, device: str) -> dict:
    ds.to(device)
    idx = lambda: torch.randint(0, len(ds), (batch,))  # noqa: E731
    sec = timed(lambda: ds.get_batch(idx()), 50, sync=device.startswith("cuda"))
    return {"dataset_samples_per_s": batch / sec}


def bench_train(cfg, ds: ChunkDataset, device: str, batch: int) -> dict:
    from ript.stages.stage1 import prior_loss

    out = {}
    cuda = device.startswith("cuda")
    ae = ActionAutoencoder(**autoencoder_kwargs(cfg)).to(device)
    opt, sched = training.make_optimizer(ae.parameters(), cfg.train, 10**6, device)
    optimiser_step0 = training.GuardedStep(ae, opt, sched, 1.0)

    def step0():
        b = ds.get_batch(torch.randint(0, len(ds), (batch,)))
        with training.autocast(device, "auto"):
            o = ae(ae.action_normalizer.normalize(b["actions"]), b["action_mask"])
        optimiser_step0(o["loss"], 0)

    out["stage0_train_samples_per_s"] = batch / timed(step0, 20 if cuda else 5, sync=cuda)
    prior = make_prior(cfg, ds).to(device).train()
    opt, sched = training.make_optimizer(prior.parameters(), cfg.train, 10**6, device)
    optimiser_step1 = training.GuardedStep(prior, opt, sched, 1.0)
    gen = torch.Generator(device=ds.device).manual_seed(0)

    def step1():
        b = ds.get_batch(torch.randint(0, len(ds), (batch,)))
        with training.autocast(device, "auto"):
            o = prior_loss(prior, b, cfg, gen, 0.0)
        optimiser_step1(o["loss"], 0)

    out["stage1_train_samples_per_s"] = batch / timed(step1, 10 if cuda else 3, sync=cuda)
    out["stage1_params_M"] = sum(p.numel() for p in prior.parameters()) / 1e6
    prior.eval()
    b = ds.get_batch(torch.randint(0, len(ds), (64,)))
    with torch.no_grad(), training.autocast(device, "auto"):
        ctx = prior.context(b["obs"], b["task_ids"])
        for cache in (True, False):
            sec = timed(lambda cache=cache: prior.sample(ctx, 1.0, 10, use_cache=cache), 10, sync=cuda)
            out[f"sample_b64_ms_{'kv' if cache else 'nokv'}"] = 1000 * sec
        out["policy_b64_ms"] = 1000 * timed(lambda: prior.predict_actions(b["obs"], b["task_ids"], top_k=10), 10,
                                            sync=cuda)
    return out


def bench_sim(cfg) -> dict:
    render = RenderSettings.from_dict(cfg.task.render)
    task = MetaWorldTask(TASKS[0], render, 500)
    pol = expert_policy(TASKS[0])
    obs = task.reset(0, render=False)
    n = 200
    t = time.perf_counter()
    for _ in range(n):
        obs, _, done, _ = task.step(pol.get_action(obs["env_state"].astype(np.float64)), render=False)
        if done:
            obs = task.reset(1, render=False)
    step = (time.perf_counter() - t) / n
    frame = timed(task.render_images, 20) / len(render.cameras)
    task.close()
    return {"sim_step_ms": 1000 * step, "render_frame_ms": 1000 * frame, "render": render.to_dict(),
            "floor_collect_steps_per_s_per_core": 1 / (step + frame * len(render.cameras))}


def rollout_floor(sim: dict, cfg) -> float:
    """Env steps per second one core can simulate in a rollout: a physics step each step, and the cameras'
    frames only for the observations a decision reads (``frame_stack`` of every ``action_horizon`` steps)."""
    frames_per_step = len(cfg.task.render.cameras) * int(cfg.algo.frame_stack) / int(cfg.algo.action_horizon)
    return 1000 / (sim["sim_step_ms"] + frames_per_step * sim["render_frame_ms"])


def bench_concurrent_floor(cfg, workers: int) -> dict:
    """The floor measured with ``workers`` processes at once (`benchmarks/render_floor.py`), spread over EGL
    devices as the runner's workers are: on a GPU host the processes share one device's readbacks, so this,
    not the per-core rate times the workers, is what collection and rollouts can reach (docs/speed.md)."""
    from benchmarks.render_floor import measure
    from ript.envs.gl import worker_render_gpus

    devices = worker_render_gpus(workers)
    devices = devices if any(d is not None for d in devices) else None
    every_rollout = max(1, int(cfg.algo.action_horizon) // int(cfg.algo.frame_stack))
    kw = dict(task=TASKS[1], image_size=int(cfg.task.render.image_size), cameras=tuple(cfg.task.render.cameras),
              seconds=5.0)
    return {"concurrent_floor": {"workers": workers,
                                 "collect": measure(workers, 1, 1, devices, **kw)["env_steps_per_s"],
                                 "rollout": measure(workers, 1, every_rollout, devices, **kw)["env_steps_per_s"]}}


TARGETS = {"stage1 samples/s": 20000, "stage0 samples/s": 50000, "collection env steps/s": 5000,
           "evaluation env steps/s": 6000, "RL rollout env steps/s": 6000}  # the targets on one H100 host


def summary(results: dict, cfg) -> str:
    """One row per figure: measured, floor, measured/floor, target, measured/target."""
    rows = []
    compiled = results.get("compiled", {}).get("variants", {})
    for variant, r in compiled.items():
        for stage in ("stage0", "stage1"):
            rows.append((f"{stage} samples/s ({variant})", r[f"{stage}_samples_per_s"], None,
                         TARGETS[f"{stage} samples/s"]))
    for stage in ("stage0", "stage1"):
        if f"{stage}_train_samples_per_s" in results:
            rows.append((f"{stage} samples/s (eager, autocast)", results[f"{stage}_train_samples_per_s"], None, None))
    if "policy_b64_ms" in results:
        rows.append(("policy decision, batch 64 (ms)", results["policy_b64_ms"], None, None))
    sim = results if "sim_step_ms" in results else None
    per_core = {"collect": sim and sim["floor_collect_steps_per_s_per_core"],
                "rollout": sim and rollout_floor(sim, cfg)}
    measured = {  # label -> (env steps/s by worker count, the per-core floor that applies)
        "collection env steps/s": (results.get("collect_env_steps_per_s"), per_core["collect"]),
        "evaluation env steps/s": ({w: r["env_steps_per_second"] for w, r in results.get("eval", {}).items()},
                                   per_core["rollout"]),
        "RL rollout env steps/s": ({w: r["env_steps_per_s"] for w, r in results.get("rl", {}).get(
            "per_workers", {}).items()}, per_core["rollout"]),
    }
    concurrent = results.get("concurrent_floor", {})
    for label, (by_workers, floor) in measured.items():
        if by_workers:
            w = max(by_workers)
            rows.append((f"{label}, {w} workers", by_workers[w], floor and w * floor, TARGETS[label]))
            if concurrent.get("workers") == w:
                pattern = "collect" if label.startswith("collection") else "rollout"
                rows.append((f"  same, against {w} processes measured at once", by_workers[w], concurrent[pattern],
                             None))
    if "rl" in results:
        r = results["rl"]["per_workers"][max(results["rl"]["per_workers"])]
        rows += [("RL iteration: rollout (s)", r["rollout_s"], None, None),
                 ("RL iteration: training (s)", r["train_s"], None, None),
                 ("RL iteration: policy share of the rollout", r["inference_share"], None, None)]

    def ratio(a, b):
        return f"{a / b:.2f}" if b else "-"

    def number(x):
        return f"{x:.4g}" if x else "-"

    lines = [f"{'figure':<52} {'measured':>10} {'floor':>10} {'/floor':>7} {'target':>8} {'/target':>8}"]
    for label, value, floor, target in rows:
        lines.append(f"{label:<52} {number(value):>10} {number(floor):>10} {ratio(value, floor):>7} "
                     f"{number(target):>8} {ratio(value, target):>8}")
    return "\n".join(lines)


def bench_collect(cfg, workers: list[int], tmp: Path) -> dict:
    from ript.experts.collect import collect_demos

    out = {}
    for w in workers:
        d = tmp / f"collect{w}"
        t = time.perf_counter()
        stats = collect_demos("metaworld", TASKS, d, 4 * w, RenderSettings.from_dict(cfg.task.render).to_dict(),
                              int(cfg.task.max_episode_steps), num_workers=w, episodes_per_job=2)
        steps = sum(s["mean_length"] * s["demos"] for s in stats.values())
        out[w] = steps / (time.perf_counter() - t)
    return {"collect_env_steps_per_s": out}


def bench_eval(cfg, ds: ChunkDataset, workers: list[int], device: str) -> dict:
    from ript.envs.runner import EnvRunner, RunnerOptions
    from ript.policies.chunk_policy import ChunkPolicy

    prior = make_prior(cfg, ds)
    out = {}
    for w in workers:
        runner = EnvRunner(RunnerOptions("metaworld", TASKS, dict(cfg.task.render), 100, episodes_per_task=w,
                                         num_workers=w))
        policy = ChunkPolicy(prior, int(cfg.algo.action_horizon), top_k=10, device=device, amp=device != "cpu")
        runner.run(policy)  # warm-up: spawns workers, builds envs
        res = runner.run(policy)
        runner.close()
        out[w] = {k: res[k] for k in ("env_steps_per_second", "worker_busy_share", "policy_share")}
    return {"eval": out}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="data,train,compiled,sample,sim,floor,collect,eval,rl")
    ap.add_argument("--workers", default=None, help="comma-separated worker counts (default: 1,2,4,.. up to cores)")
    ap.add_argument("--overrides", nargs="*", default=[], help="hydra overrides for the stage1 config")
    ap.add_argument("--demos", type=int, default=6)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    only = set(args.only.split(","))
    cfg = compose("stage1", args.overrides)
    device = resolve_device(cfg.device)
    cores = os.cpu_count() or 1
    workers = [int(w) for w in args.workers.split(",")] if args.workers else sorted(
        {min(cores, 2**i) for i in range(0, 8) if 2**i <= cores} | {cores})
    results: dict = {"device": torch.cuda.get_device_name() if device.startswith("cuda") else f"cpu x{cores}",
                     "config": {"image_size": cfg.task.render.image_size, "algo": cfg.algo.name}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ds = None
        if only & {"data", "train", "sample", "eval"}:
            ds = demo_dataset(cfg, tmp / "data", args.demos)
        if "data" in only:
            results["cpu"] = bench_data(ds, args.batch, "cpu")
            if device != "cpu":
                results[device] = bench_data(ds, args.batch, device)
        if only & {"train", "sample"}:
            results.update(bench_train(cfg, ds.to(device), device, args.batch))
        if "sim" in only:
            results.update(bench_sim(cfg))
        if "floor" in only:
            results.update(bench_concurrent_floor(cfg, max(workers)))
        if "collect" in only:
            results.update(bench_collect(cfg, workers, tmp))
        if "eval" in only:
            results.update(bench_eval(cfg, ds.to("cpu"), workers, device))
    if "compiled" in only and device.startswith("cuda"):
        from benchmarks.train_speed import bench_variants

        results["compiled"], _ = bench_variants(cfg, ["fp32", "bf16", "bf16+cl+tf32+compile+graphs"], args.batch,
                                                int(cfg.task.render.image_size), 20)
    if "rl" in only:
        from benchmarks.bench_rl import bench_rl

        results["rl"] = bench_rl(cfg, workers, device, groups=8, k=8, horizon=100)
    report = summary(results, cfg)
    results["summary"] = report.splitlines()
    text = json.dumps(results, indent=2, default=str)
    print(text)
    print(report)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
