"""Training-step speed of stage 0 and stage 1 at the real model sizes, with a kernel profile of each.

    python -m benchmarks.train_speed [--variants fp32,bf16,bf16+cl+compile] [--batch 256] [--image-size 128]
        [--profile] [--breakdown] [--out results.json]

A variant is the amp setting (fp32 or bf16) and any of +cl (channels-last weights), +compile (torch.compile of
the loss), +graphs (its CUDA-graph mode), +tf32 (TF32 matmuls), +bench (cuDNN autotuning): the ``train.*``
switches the stages read; +sync: the earlier optimiser step (a host sync every step to check
finiteness) instead of GuardedStep's.

The inputs are synthetic tensors of the real shapes (two cameras, uint8 images, 4-D MetaWorld actions), fed
through the same ``get_batch``-style gather from a device-resident dataset; the model, loss and optimiser are
the stages' own. ``--profile`` prints the top CUDA kernels and CPU ops of a few steps of each variant, which
is what tells a launch-bound step (many tiny kernels, GPU idle) from a compute-bound one. ``--breakdown`` records
that in the results: stage 1's GPU kernel time per step by kind (matrix multiplies, convolutions, attention, fused
elementwise, optimiser, copies), the share of the step the GPU spends in kernels, and the model's FLOPs per sample
(counted on one eager forward and backward) against the card's dense bf16 peak.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from ript.config import compose
from ript.models.action_autoencoder import ActionAutoencoder
from ript.models.prior import SkillPrior
from ript.stages.stage0 import autoencoder_kwargs
from ript.stages.stage1 import prior_loss
from ript.utils import training

# dense bf16 tensor-core peaks of the cards the speed targets are set on (NVIDIA's SXM data sheets), FLOP/s
BF16_PEAK_FLOPS = {"H100": 989e12, "H200": 989e12}
# a CUDA kernel's kind from its name, the first match winning (cuDNN's convolutions are implicit GEMMs by name)
KERNEL_KINDS = (
    ("attention", ("flash", "fmha", "attention")),
    ("convolution", ("conv", "fprop", "dgrad", "wgrad", "implicit", "winograd")),
    ("matmul", ("gemm", "cutlass", "nvjet", "xmma", "cublas")),
    ("optimizer", ("multi_tensor", "adam", "foreach")),
    ("copy", ("memcpy", "memset")),
    ("fused elementwise (compiled)", ("triton",)),
)


def kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, marks in KERNEL_KINDS if any(m in low for m in marks)), "other")


class SyntheticData:
    """A device-resident set of N samples of the real shapes, gathered by index like ``ChunkDataset``."""

    def __init__(self, n: int, image_size: int, cameras: int, chunk: int, action_dim: int, device: str):
        g = torch.Generator().manual_seed(0)
        self.images = {f"cam{i}_rgb": torch.randint(0, 256, (n, image_size, image_size, 3), dtype=torch.uint8,
                                                     generator=g).to(device) for i in range(cameras)}
        self.state = torch.randn(n, 39, generator=g).to(device)
        self.actions = (torch.rand(n + chunk, action_dim, generator=g) * 2 - 1).to(device)
        self.n, self.chunk, self.device = n, chunk, device

    def batch(self, b: int) -> dict:
        idx = torch.randint(0, self.n, (b,), device=self.device)
        act_idx = idx[:, None] + torch.arange(self.chunk, device=self.device)
        obs = {k: v[idx][:, None] for k, v in self.images.items()}
        obs["robot_states"] = self.state[idx][:, None]
        return {"obs": obs, "actions": self.actions[act_idx], "task_ids": torch.zeros(b, dtype=torch.long,
                                                                                      device=self.device),
                "action_mask": torch.ones(b, self.chunk, dtype=torch.bool, device=self.device)}


def timed(step, n: int, warmup: int, windows: int = 5) -> float:
    """Seconds per step: the median over ``windows`` windows of ``n`` steps (one window of a few hundred ms
    varied 2-3x between machines of the same kind for stage 0's ~5 ms step)."""
    for _ in range(warmup):
        step()
    per_window = []
    for _ in range(windows):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            step()
        torch.cuda.synchronize()
        per_window.append((time.perf_counter() - t) / n)
    return float(np.median(per_window))


def profile(step, label: str, rows: int = 25) -> str:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=60)
    return f"==== {label}\n{table}"


def kernel_breakdown(step, step_ms: float, steps: int = 5) -> dict:
    """GPU kernel time per step by kind and kernels launched per step, over ``steps`` profiled steps; the share
    of the (unprofiled) step time the GPU spends in kernels tells how far launch and host time hold it back."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    by_kind, kernels = defaultdict(float), 0
    for event in prof.key_averages():
        if event.device_type == DeviceType.CUDA:
            by_kind[kernel_kind(event.key)] += event.self_device_time_total / 1000 / steps
            kernels += event.count
    kernel_ms = sum(by_kind.values())
    return {"kernel_ms_per_step": kernel_ms, "gpu_busy_share": kernel_ms / step_ms,
            "kernels_per_step": kernels / steps,
            "kernel_ms_by_kind": dict(sorted(by_kind.items(), key=lambda kv: -kv[1]))}


def flops_per_sample(forward_backward, batch: int) -> float:
    """Model FLOPs of one training sample (forward and backward), counted on one eager call."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        forward_backward()
    return counter.get_total_flops() / batch


def compute_share(flops: float, samples_per_s: float) -> dict:
    achieved = flops * samples_per_s
    peak = next((v for k, v in BF16_PEAK_FLOPS.items() if k in torch.cuda.get_device_name()), None)
    return {"gflops_per_sample": flops / 1e9, "achieved_tflops": achieved / 1e12,
            "bf16_peak_tflops": peak and peak / 1e12, "share_of_peak": peak and achieved / peak}


def train_settings(variant: str) -> dict:
    parts = variant.split("+")
    return {"amp": {"fp32": False, "bf16": "auto"}[parts[0]], "channels_last": "cl" in parts,
            "compile": "compile" in parts, "cuda_graphs": "graphs" in parts, "tf32": "tf32" in parts,
            "cudnn_benchmark": "bench" in parts}


def synchronous_step(model, opt, sched):
    """The earlier optimiser step, for comparison (variant ``+sync``): the loss and gradient norm
    read back to the host every step to check they are finite."""
    params = [p for p in model.parameters() if p.requires_grad]

    def step(loss, _step):
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        if not all(map(math.isfinite, torch.stack([loss.detach().float(), norm.float()]).tolist())):
            raise training.NonFiniteLoss("non-finite loss")
        opt.step()
        sched.step()

    return step


def make_steps(cfg, data: SyntheticData, batch: int, variant: str, device: str):
    """(stage-0 step, stage-1 step) as the stages run them: autocast, loss, guarded optimiser step."""
    train_cfg = OmegaConf.merge(cfg.train, train_settings(variant))
    training.fast_math(device, train_cfg)
    ae = ActionAutoencoder(**autoencoder_kwargs(cfg)).to(device).train()
    opt0, sched0 = training.make_optimizer(ae.parameters(), train_cfg, 10**6, device)
    forward = training.CompiledLoss(ae, train_cfg, device)
    sync = "sync" in variant.split("+")
    optimiser_step0 = synchronous_step(ae, opt0, sched0) if sync else training.GuardedStep(ae, opt0, sched0, 1.0)

    def step0():
        b = data.batch(batch)
        with training.autocast(device, train_cfg.amp):
            out = forward(ae.action_normalizer.normalize(b["actions"]), b["action_mask"])
        optimiser_step0(out["loss"], 0)

    prior = SkillPrior(autoencoder=autoencoder_kwargs(cfg), task_names=["t"], image_keys=list(data.images),
                       lowdim_dims={"robot_states": 39}, lang_dim=384, frame_stack=1,
                       **dict(cfg.algo.prior)).to(device).train()
    training.prepare_model(prior, device, train_cfg)
    opt1, sched1 = training.make_optimizer(prior.parameters(), train_cfg, 10**6, device)
    gen = torch.Generator(device=device).manual_seed(0)
    loss_fn = training.CompiledLoss(prior.loss, train_cfg, device)
    optimiser_step1 = synchronous_step(prior, opt1, sched1) if sync else training.GuardedStep(prior, opt1, sched1, 1.0)

    def step1():
        b = data.batch(batch)
        with training.autocast(device, train_cfg.amp):
            out = prior_loss(prior, b, cfg, gen, 0.0, loss_fn)
        optimiser_step1(out["loss"], 0)

    def eager_forward_backward1():  # what the FLOP counter sees: the uncompiled loss, its gradients dropped
        with training.autocast(device, train_cfg.amp):
            out = prior_loss(prior, data.batch(batch), cfg, gen, 0.0, prior.loss)
        out["loss"].backward()
        prior.zero_grad(set_to_none=True)

    return step0, step1, eager_forward_backward1


def bench_variants(cfg, variants: list[str], batch: int, image_size: int, steps: int,
                   with_profile: bool = False, breakdown: bool = False) -> tuple[dict, list[str]]:
    """Stage-0 and stage-1 steps per second on the GPU for each variant (fp32, bf16, compiled, CUDA graphs)."""
    device = "cuda"
    data = SyntheticData(2048, image_size, 2, int(cfg.algo.chunk_size), 4, device)
    results = {"device": torch.cuda.get_device_name(), "batch": batch, "image_size": image_size,
               "torch": torch.__version__, "variants": {}}
    tables = []
    for variant in variants:
        t0 = time.perf_counter()
        step0, step1, eager1 = make_steps(cfg, data, batch, variant, device)
        torch.cuda.reset_peak_memory_stats()
        s0 = timed(step0, steps * 2, 5)
        s1 = timed(step1, steps, 3)
        results["variants"][variant] = {"stage0_samples_per_s": batch / s0, "stage0_step_ms": 1000 * s0,
                                        "stage1_samples_per_s": batch / s1, "stage1_step_ms": 1000 * s1,
                                        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
                                        "setup_and_timing_s": time.perf_counter() - t0}
        if breakdown:
            results["variants"][variant]["stage1_kernels"] = kernel_breakdown(step1, 1000 * s1)
            results["variants"][variant]["stage1_compute"] = compute_share(flops_per_sample(eager1, batch),
                                                                           batch / s1)
        print(variant, json.dumps(results["variants"][variant]), flush=True)
        if with_profile:
            tables += [profile(step0, f"stage0 {variant}"), profile(step1, f"stage1 {variant}")]
    return results, tables


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="fp32,bf16,fp32+cl+tf32+compile,bf16+cl+tf32+compile+graphs")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--image-size", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--breakdown", action="store_true", help="stage 1's kernel time by kind and its FLOPs")
    ap.add_argument("--out", default=None)
    ap.add_argument("--overrides", nargs="*", default=[])
    args = ap.parse_args()
    cfg = compose("stage1", ["algo=quest", "task.action_dim=4", *args.overrides])
    results, tables = bench_variants(cfg, args.variants.split(","), args.batch, args.image_size, args.steps,
                                     args.profile, args.breakdown)
    text = json.dumps(results, indent=2)
    print(text)
    for t in tables:
        print(t)
    if args.out:
        Path(args.out).write_text(text + "\n" + "\n".join(tables))


if __name__ == "__main__":
    main()
