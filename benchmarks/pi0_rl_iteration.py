"""One PPO iteration of π0 at its real size (PaliGemma 2B prefix, Gemma 300M action expert) with random weights,
for each noise method: the rollout's batched decisions (prefix once, K denoise steps), the update over the
recorded decisions (the prefix encoded again without gradient, the expert trained), their times and the GPU's
peak memory. No simulator: the observations are random frames and states (time and memory do not depend on them).

    python -m benchmarks.pi0_rl_iteration [--envs 32] [--rounds 8] [--steps 4] [--micro-batch 32] [--out FILE]
    python -m benchmarks.pi0_rl_iteration --size tiny   # the same code at test size, on a CPU
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ript.config import compose
from ript.models.flow_denoise import Denoising
from ript.models.pi0.model import Pi0Model
from ript.policies.pi0_policy import Pi0Policy
from ript.rl.flow_learner import FlowLearner
from ript.rl.update import make_optimizer, ppo_update
from ript.utils.distributed import DistInfo
from tests.helpers.official_checkpoints import PROMPT_WORDS, write_tokenizer

SIZES = {"full": ("gemma_2b", "gemma_300m", "so400m"), "tiny": ("gemma_tiny", "gemma_tiny_expert", "tiny")}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def one_iteration(model, tokenizer, method: str, args, device: str) -> dict:
    cfg = compose("rl", ["policy=pi0", "task=libero_spatial", "rl.advantage=gae", f"rl.epochs={args.epochs}",
                         f"rl.minibatches={args.minibatches}", f"rl.micro_batch={args.micro_batch}",
                         f"policy.noise_method={method}", f"policy.denoise_steps={args.steps}", "rl.lr=5e-6",
                         "rl.critic.lr=1e-4"])
    stats = {part: {"mean": torch.zeros(dim), "std": torch.ones(dim)} for part, dim in (("state", 8), ("actions", 7))}
    names = [f"task{i}" for i in range(4)]
    denoising = Denoising(steps=args.steps, method=method)
    policy = Pi0Policy(model, tokenizer, stats, dict.fromkeys(names, "pick up the bowl and place it"), cfg.policy,
                       denoising, 5, 7, device, seed=0, amp=device.startswith("cuda"), cuda_graph=False,
                       deterministic=False)
    learner = FlowLearner(model, denoising, 5, True, "element", cfg.rl.critic, "expert", trainable_only=True)
    learner.attach(policy)
    rng = np.random.default_rng(0)
    policy.reset(args.envs)
    for i in range(args.envs):
        policy.reset_env(i, names[i % len(names)], i)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    decide = []
    for _ in range(args.rounds):
        for i in range(args.envs):
            size = args.image_size
            policy.observe(i, {"agentview_rgb": rng.integers(0, 255, (size, size, 3), dtype=np.uint8),
                               "eye_in_hand_rgb": rng.integers(0, 255, (size, size, 3), dtype=np.uint8),
                               "ee_states": rng.standard_normal(6).astype(np.float32),
                               "gripper_states": rng.standard_normal(2).astype(np.float32)})
        sync(device)
        t0 = time.perf_counter()
        policy.act_chunk([True] * args.envs)
        sync(device)
        decide.append(time.perf_counter() - t0)
    rollout_peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else 0.0
    decisions = [d for i in range(args.envs) for d in policy.take_record(i)]
    data = learner.collate(decisions, device)
    n = len(decisions)
    data.update(advantages=torch.randn(n, device=device), old_values=torch.stack([d["value"] for d in decisions]).to(
        device), returns=torch.rand(n, device=device))
    opt, sched = make_optimizer(learner, cfg, device)
    model.train()
    sync(device)
    t0 = time.perf_counter()
    metrics = ppo_update(learner, opt, sched, data, cfg, DistInfo(), 0, device)
    sync(device)
    update = time.perf_counter() - t0
    model.eval()
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else 0.0
    return {"noise_method": method, "decisions": n, "batch": args.envs, "denoise_steps": args.steps,
            "decision_batch_s_first": round(decide[0], 3), "decision_batch_s": round(float(np.median(decide[1:] or
                                                                                                      decide)), 4),
            "update_s": round(update, 2), "rollout_peak_gib": round(rollout_peak, 2), "peak_gib": round(peak, 2),
            "approx_kl": metrics.get("approx_kl"), "clip_fraction": metrics.get("clip_fraction")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=list(SIZES), default="full")
    ap.add_argument("--envs", type=int, default=32, help="envs planned per batched decision")
    ap.add_argument("--rounds", type=int, default=8, help="decisions per env (the update trains on envs x rounds)")
    ap.add_argument("--steps", type=int, default=4, help="denoise steps (πRL's π0: 4)")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--minibatches", type=int, default=4)
    ap.add_argument("--micro-batch", type=int, default=32)
    ap.add_argument("--image-size", type=int, default=128, help="the rendered frames' size (resized to 224)")
    ap.add_argument("--methods", default="flow_sde,flow_noise")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    t0 = time.perf_counter()
    with torch.device(device):
        model = Pi0Model(*SIZES[args.size]).to(dtype)
    model.expert_layers.float()  # RL trains the expert in fp32 (its optimiser state too); the prefix stays bf16
    for part in (model.expert_norm, model.state_proj, model.action_in_proj, model.action_time_mlp_in,
                 model.action_time_mlp_out, model.action_out_proj, model.noise_head):
        part.float()
    build = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        write_tokenizer(Path(tmp), PROMPT_WORDS + ["bowl", "and", "it", "the"])
        from transformers import PreTrainedTokenizerFast

        tokenizer = PreTrainedTokenizerFast.from_pretrained(tmp)
    params = sum(p.numel() for p in model.parameters())
    rows = [one_iteration(model, tokenizer, m, args, device) for m in args.methods.split(",")]
    out = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "size": args.size,
           "parameters_m": round(params / 1e6, 1), "trained_m": round(sum(p.numel() for p in model.expert_parameters())
                                                                     / 1e6, 1),
           "build_s": round(build, 1), "torch": torch.__version__, "iterations": rows}
    print(json.dumps(out, indent=2))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
