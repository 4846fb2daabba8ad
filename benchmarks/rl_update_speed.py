"""The RL update's speed for a chunk policy whose encoders train (``rl.train_prior_only=false``), against the
stage-1 training step of the same model: decisions scored forward + backward per second.

    python -m benchmarks.rl_update_speed [--decisions 2048] [--image-size 64] [--variants eager,compiled]
        [--critic] [--out results.json] [--compile-cache <folder>]

The decisions are synthetic (random uint8 images from two cameras, MetaWorld's 39-d state, random tokens and
advantages) in the layout the chunk policy records them; the learner, ``ppo_update`` (rl.epochs x
rl.minibatches optimiser steps, micro-batches of rl.micro_batch) and the optimiser are the RL stage's own.
Variants: ``eager`` (eager scoring, no TF32 or channels-last: the earlier update), ``eager+fast``
(TF32, channels-last), ``compiled`` (also torch.compile with every micro-batch padded to rl.micro_batch rows,
replayed as CUDA graphs: the RL stage's default on CUDA). The first update of each variant (compilation) is
timed apart.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from benchmarks.train_speed import SyntheticData, make_steps, timed
from ript.config import compose
from ript.models.prior import SkillPrior
from ript.rl.learners import ChunkLearner
from ript.rl.update import make_optimizer, ppo_update
from ript.stages.stage0 import autoencoder_kwargs
from ript.utils import training
from ript.utils.compile_cache import CACHE_FILE, CompileCache
from ript.utils.distributed import DistInfo


def synthetic_decisions(n: int, image_size: int, tokens: int, vocab: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        obs = {f"cam{i}_rgb": torch.randint(0, 256, (1, image_size, image_size, 3), dtype=torch.uint8, generator=g)
               for i in range(2)}
        obs["robot_states"] = torch.randn(1, 39, generator=g)
        out.append({"obs": obs, "task_id": 0, "tokens": torch.randint(0, vocab, (tokens,), generator=g),
                    "log_probs": -torch.rand(tokens, generator=g) * 3, "value": torch.rand((), generator=g)})
    return out


def bench_variant(model_cfg, cfg, variant: str, decisions: list[dict], with_critic: bool, device: str,
                  updates: int) -> dict:
    fast = variant != "eager"
    training.fast_math(device, OmegaConf.create({"tf32": fast, "cudnn_benchmark": False, "deterministic": False}))
    prior = SkillPrior(autoencoder=autoencoder_kwargs(model_cfg), task_names=["t"], image_keys=["cam0_rgb", "cam1_rgb"],
                       lowdim_dims={"robot_states": 39}, lang_dim=384, frame_stack=1,
                       **dict(model_cfg.algo.prior)).to(device)
    training.prepare_model(prior, device, OmegaConf.create({"channels_last": fast}))
    static = int(cfg.rl.micro_batch) if variant == "compiled" else None
    learner = ChunkLearner(prior, {"temperature": 1.0, "top_k": None}, prior_only=False,
                           critic_cfg=cfg.rl.critic if with_critic else None, static_batch=static,
                           compile_scoring=static is not None)
    opt, sched = make_optimizer(learner, cfg, device)
    info = DistInfo()
    t = time.perf_counter()
    data = learner.collate(decisions, device)
    collate_s = time.perf_counter() - t
    n = len(decisions)
    g = torch.Generator().manual_seed(1)
    data["advantages"] = torch.randn(n, generator=g).to(device)
    if with_critic:
        data["old_values"] = torch.stack([d["value"] for d in decisions]).to(device)
        data["returns"] = torch.rand(n, generator=g).to(device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    t = time.perf_counter()
    ppo_update(learner, opt, sched, data, cfg, info, 0, device)
    sync()
    first_s = time.perf_counter() - t
    t = time.perf_counter()
    for it in range(updates):
        ppo_update(learner, opt, sched, data, cfg, info, it + 1, device)
    sync()
    per_update = (time.perf_counter() - t) / updates
    passes = n * int(cfg.rl.epochs)
    return {"decisions": n, "epochs": int(cfg.rl.epochs), "minibatches": int(cfg.rl.minibatches),
            "micro_batch": cfg.rl.micro_batch, "collate_s": collate_s, "first_update_s": first_s,
            "update_s": per_update, "decision_passes_per_s": passes / per_update,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--decisions", type=int, default=2048)
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--variants", default="eager,eager+fast,compiled")
    ap.add_argument("--critic", action="store_true", help="PPO-GAE: the value head and its loss too")
    ap.add_argument("--updates", type=int, default=2)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--stage1", action="store_true", help="also the stage-1 step (eager bf16, and compiled)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--compile-cache", default=None,
                    help="a folder: load its compile_cache.bin, if there is one, before the variants run, and keep "
                         "what they compiled there (a run folder's cache; the compiled variant's first update then "
                         "shows what it saves on a host whose compiler cache is empty)")
    ap.add_argument("--overrides", nargs="*", default=[])
    args = ap.parse_args()
    # the stage-1 config for the model and autoencoder sizes, the RL config for the update
    model_cfg = compose("stage1", ["algo=quest", "task.action_dim=4"])
    cfg = compose("rl", ["checkpoint=x", *args.overrides])
    vocab = math.prod(int(level) for level in model_cfg.algo.autoencoder.fsq_levels)  # FSQ's codebook
    decisions = synthetic_decisions(args.decisions, args.image_size,
                                    int(model_cfg.algo.chunk_size) // int(model_cfg.algo.downsample), vocab)
    results = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
               "image_size": args.image_size, "critic": args.critic, "torch": torch.__version__, "rl": {}}
    cache = None
    if args.compile_cache:
        results["compile_cache_loaded"] = (Path(args.compile_cache) / CACHE_FILE).exists()
        cache = CompileCache(Path(args.compile_cache), None, is_main=True)
    for variant in args.variants.split(","):
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        results["rl"][variant] = bench_variant(model_cfg, cfg, variant, decisions, args.critic, args.device,
                                               args.updates)
        print(variant, json.dumps(results["rl"][variant]), flush=True)
    if cache is not None:
        cache.save()
    if args.stage1 and args.device.startswith("cuda"):
        data = SyntheticData(2048, args.image_size, 2, int(model_cfg.algo.chunk_size), 4, args.device)
        for variant in ("bf16", "bf16+cl+tf32+compile+graphs"):
            step1 = make_steps(model_cfg, data, int(cfg.rl.micro_batch), variant, args.device)[1]
            results[f"stage1_{variant}_samples_per_s"] = int(cfg.rl.micro_batch) / timed(step1, 10, 3)
            print(variant, results[f"stage1_{variant}_samples_per_s"], flush=True)
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
