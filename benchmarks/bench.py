"""Speed of the staged pipeline on whatever machine runs it.

    python benchmarks/bench.py [--only data,train,sample,sim,collect,eval] [--workers 1,2,4] [--out bench.json]

Prints: dataset samples/s; stage-0 and stage-1 training samples/s (eager; `benchmarks/train_speed.py` times the
compiled/CUDA-graph step and its variants with kernel profiles);
prior sampling latency for a batch of 64 with and without the KV cache; the simulator floor (one physics
step, one rendered frame); env-steps/s of collection and evaluation against the number of workers.
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

from ript.config import compose, resolve_device
from ript.data.dataset import ChunkDataset, DatasetSpec
from ript.envs.metaworld import MetaWorldTask, RenderSettings, expert_policy
from ript.models.action_autoencoder import ActionAutoencoder
from ript.models.prior import SkillPrior
from ript.stages.stage0 import autoencoder_kwargs
from ript.utils import training

TASKS = ["button-press-v3", "drawer-close-v3"]


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


def ensure_data(cfg, data_dir: Path, demos: int) -> list[Path]:
    from ript.data.collect import collect_demos

    collect_demos("metaworld", TASKS, data_dir, demos, RenderSettings.from_dict(cfg.task.render).to_dict(),
                  int(cfg.task.max_episode_steps), episodes_per_job=max(1, demos // 2))
    return [data_dir / f"{t}.hdf5" for t in TASKS]


def demo_dataset(cfg, data_dir: Path, demos: int) -> ChunkDataset:
    """Scripted demos of the benchmark tasks (collected if missing) as one training dataset."""
    files = ensure_data(cfg, data_dir, demos)
    return ChunkDataset(DatasetSpec(files, dict(cfg.task.obs_keys), int(cfg.algo.chunk_size),
                                    int(cfg.algo.frame_stack), val_fraction=0.0), "all")


def bench_data(ds: ChunkDataset, batch: int, device: str) -> dict:
    ds.to(device)
    idx = lambda: torch.randint(0, len(ds), (batch,))  # noqa: E731
    sec = timed(lambda: ds.get_batch(idx()), 50, sync=device.startswith("cuda"))
    return {"dataset_samples_per_s": batch / sec}


def make_prior(cfg, ds: ChunkDataset) -> SkillPrior:
    shapes = ds.obs_shapes()
    return SkillPrior(autoencoder=autoencoder_kwargs(cfg), task_names=ds.task_names,
                      image_keys=[k for k, s in shapes.items() if len(s) == 3],
                      lowdim_dims={k: s[0] for k, s in shapes.items() if len(s) == 1}, lang_dim=384,
                      frame_stack=int(cfg.algo.frame_stack), **dict(cfg.algo.prior))


def bench_train(cfg, ds: ChunkDataset, device: str, batch: int) -> dict:
    from ript.stages.stage1 import prior_loss

    out = {}
    cuda = device.startswith("cuda")
    ae = ActionAutoencoder(**autoencoder_kwargs(cfg)).to(device)
    opt, sched = training.make_optimizer(ae.parameters(), cfg.train, 10**6, device)

    def step0():
        b = ds.get_batch(torch.randint(0, len(ds), (batch,)))
        with training.autocast(device, "auto"):
            o = ae(ae.action_normalizer.normalize(b["actions"]), b["action_mask"])
        training.grad_norm_step(ae, opt, sched, o["loss"], 1.0, 0)

    out["stage0_train_samples_per_s"] = batch / timed(step0, 20 if cuda else 5, sync=cuda)
    prior = make_prior(cfg, ds).to(device).train()
    opt, sched = training.make_optimizer(prior.parameters(), cfg.train, 10**6, device)
    gen = torch.Generator(device=ds.device).manual_seed(0)

    def step1():
        b = ds.get_batch(torch.randint(0, len(ds), (batch,)))
        with training.autocast(device, "auto"):
            o = prior_loss(prior, b, cfg, gen, 0.0)
        training.grad_norm_step(prior, opt, sched, o["loss"], 1.0, 0)

    out["stage1_train_samples_per_s"] = batch / timed(step1, 10 if cuda else 3, sync=cuda)
    out["stage1_params_M"] = sum(p.numel() for p in prior.parameters()) / 1e6
    prior.eval()
    b = ds.get_batch(torch.randint(0, len(ds), (64,)))
    with torch.no_grad(), training.autocast(device, "auto"):
        ctx = prior.context(b["obs"], b["task_ids"])
        for cache in (True, False):
            sec = timed(lambda: prior.sample(ctx, 1.0, 10, use_cache=cache), 10, sync=cuda)
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


def bench_collect(cfg, workers: list[int], tmp: Path) -> dict:
    from ript.data.collect import collect_demos

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
    from ript.envs.runner import EnvRunner
    from ript.policies.chunk_policy import ChunkPolicy

    prior = make_prior(cfg, ds)
    out = {}
    for w in workers:
        runner = EnvRunner("metaworld", TASKS, dict(cfg.task.render), 100, episodes_per_task=w, num_workers=w)
        policy = ChunkPolicy(prior, int(cfg.algo.action_horizon), top_k=10, device=device, amp=device != "cpu")
        runner.run(policy)  # warm-up: spawns workers, builds envs
        res = runner.run(policy)
        runner.close()
        out[w] = {k: res[k] for k in ("env_steps_per_second", "worker_busy_share", "policy_share")}
    return {"eval": out}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="data,train,sample,sim,collect,eval")
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
        if "collect" in only:
            results.update(bench_collect(cfg, workers, tmp))
        if "eval" in only:
            results.update(bench_eval(cfg, ds.to("cpu"), workers, device))
    text = json.dumps(results, indent=2, default=str)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
