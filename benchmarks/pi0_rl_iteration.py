"""One PPO iteration of π0 at its real size (PaliGemma 2B prefix, Gemma 300M action expert) with random weights,
for each noise method: the rollout's batched decisions (prefix once, K denoise steps), the update over the
recorded decisions (the prefix encoded again without gradient, the expert trained), their times and the GPU's
peak memory. No simulator: the observations are random frames and states (time and memory do not depend on them).

    python -m benchmarks.pi0_rl_iteration [--envs 32] [--rounds 8] [--steps 4] [--micro-batch 32] [--out FILE]
    python -m benchmarks.pi0_rl_iteration --size tiny   # the same code at test size, on a CPU
    torchrun --nproc_per_node 2 -m benchmarks.pi0_rl_iteration --fsdp [--full]   # the update sharded over the ranks

Under torchrun with ``--fsdp`` every rank samples the same decisions with the whole model, then the model is
sharded over the ranks (``ript.rl.learners.shard_learner``) for the update: the ranks' averaged gradient is one
process's, so ``--save-weights`` (the trained weights gathered whole) matches a one-process run's. ``--full``
trains every weight (the PaliGemma prefix too), not only the action expert.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.results_file import write_or_print
from ript.config import compose
from ript.models.flow_denoise import Denoising
from ript.models.pi0.model import Pi0Model
from ript.policies.pi0_policy import Pi0Policy
from ript.rl.flow_learner import FlowLearner
from ript.rl.learners import shard_learner
from ript.rl.update import make_optimizer, ppo_update
from ript.utils import distributed as ddist
from ript.utils.fsdp import whole_state
from tests.helpers.official_checkpoints import PROMPT_WORDS, write_tokenizer

SIZES = {"full": ("gemma_2b", "gemma_300m", "so400m"), "tiny": ("gemma_tiny", "gemma_tiny_expert", "tiny")}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def one_iteration(model, tokenizer, method: str, args, device: str, info: ddist.DistInfo) -> dict:
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
    learner = FlowLearner(model, denoising, 5, not args.full, "element", cfg.rl.critic, "expert",
                          trainable_only=not args.full)
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
    fixed = torch.Generator().manual_seed(1)  # the same advantages and returns on every rank
    data.update(advantages=torch.randn(n, generator=fixed).to(device), returns=torch.rand(n, generator=fixed).to(
        device), old_values=torch.stack([d["value"] for d in decisions]).to(device))
    if args.fsdp:
        shard_learner(learner)
    opt, sched = make_optimizer(learner, cfg, device)
    model.train()
    sync(device)
    t0 = time.perf_counter()
    metrics = ppo_update(learner, opt, sched, data, cfg, info, 0, device, sharded=args.fsdp)
    sync(device)
    update = time.perf_counter() - t0
    model.eval()
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else 0.0
    trained = whole_state(learner.weights.state_dict())  # every rank gathers, in one order
    if args.save_weights and info.is_main:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in trained.items()}, str(args.save_weights.with_suffix(
            f".{method}.safetensors")))
    return {"noise_method": method, "decisions": n, "batch": args.envs, "denoise_steps": args.steps,
            "decision_batch_s_first": round(decide[0], 3), "decision_batch_s": round(float(np.median(decide[1:] or
                                                                                                      decide)), 4),
            "update_s": round(update, 2), "rollout_peak_gib": round(rollout_peak, 2), "peak_gib": round(peak, 2),
            "approx_kl": metrics.get("approx_kl"), "clip_fraction": metrics.get("clip_fraction"),
            "grad_norm": metrics.get("grad_norm"), "per_rank": ddist.gather_objects({"update_s": update,
                                                                                     "peak_gib": peak}, info)}


def random_model(size: str, device: str, expert_fp32: bool) -> Pi0Model:
    """π0 with random weights, the same on every rank: bf16 on a GPU (as ``ript rl policy=pi0`` holds it), with
    ``expert_fp32`` the action expert in fp32 (its optimiser state too) beside the bf16 prefix."""
    torch.manual_seed(0)
    with torch.device(device):
        model = Pi0Model(*SIZES[size]).to(torch.bfloat16 if device.startswith("cuda") else torch.float32)
    if expert_fp32:
        for part in model.expert_modules():
            part.float()
    return model


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
    ap.add_argument("--fsdp", action="store_true", help="under torchrun: the update sharded over the ranks")
    ap.add_argument("--full", action="store_true", help="train every weight, not only the action expert")
    ap.add_argument("--weights", choices=("expert_fp32", "bf16"), default="expert_fp32",
                    help="on a GPU: the action expert in fp32 beside the bf16 prefix, or every weight bf16")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--save-weights", type=Path, default=None, help="the trained weights (<name>.<method>.safetensors)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    device, info = ddist.init_rank(args.device)
    args.fsdp = args.fsdp and info.world_size > 1
    with tempfile.TemporaryDirectory() as tmp:
        write_tokenizer(Path(tmp), PROMPT_WORDS + ["bowl", "and", "it", "the"])
        from transformers import PreTrainedTokenizerFast

        tokenizer = PreTrainedTokenizerFast.from_pretrained(tmp)
    rows, builds = [], []
    for method in args.methods.split(","):  # each from the same random weights (a sharded model stays sharded)
        t0 = time.perf_counter()
        model = random_model(args.size, device, args.weights == "expert_fp32")
        builds.append(time.perf_counter() - t0)
        rows.append(one_iteration(model, tokenizer, method, args, device, info))
    params = sum(p.numel() for p in model.parameters())
    out = {"device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu", "size": args.size,
           "ranks": info.world_size, "fsdp": args.fsdp, "weights": args.weights, "full_finetune": args.full,
           "parameters_m": round(params / 1e6, 1), "trained_m": round(sum(p.numel() for p in (
               model.parameters() if args.full else model.expert_parameters())) / 1e6, 1),
           "build_s": round(builds[0], 1), "torch": torch.__version__, "iterations": rows}
    if info.is_main:
        write_or_print(out, args.out)
    ddist.barrier(info)


if __name__ == "__main__":
    main()
