"""One batched policy decision of the QueST-style chunk policy on its own, as RL's rollouts make it (recording,
CUDA graph, a fixed layout of ``n`` rows): its time at several batch sizes and memory layouts, and where an eager
decision's GPU work goes (the observation encoders, the prior's token sampling, the decoder): the CUDA kernels
torch.profiler records under each part, counted and their times summed (a graph replays the same kernels, without
the launch gaps). ``--compile-modes`` also times the decision fused by torch.compile (inductor) and then captured in
the same CUDA graph: fewer, larger kernels, and the seconds its first decision takes to compile.

    python -m benchmarks.decision_speed [--overrides task=metaworld_ml45_10 device=cuda ...] [--batches 1 16 64 128]
                                        [--layouts default channels_last] [--compile-modes default] [--out DIR]

The model is untrained (built on one scripted demo per task): a decision's cost does not depend on its weights.
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

from benchmarks.untrained_prior import demo_dataset, make_prior, prior_sampling
from ript.config import compose, resolve_device, task_names
from ript.envs.suites import get_suite
from ript.policies.build import make_policy
from ript.utils.atomic import atomic_write_text


def policy_with(model, settings: dict, device: str, n: int, obs: dict, task: str, cuda_graph: bool = True):
    policy = make_policy(model, settings, device, seed=0, cuda_graph=cuda_graph)
    policy.start_recording()
    policy.reset(n)
    for i in range(n):
        policy.reset_env(i, task, i)
        policy.observe(i, obs)
    return policy


def compiled(policy, mode: str):
    """The policy with its decision fused by inductor before the CUDA graph captures it (fewer, larger kernels)."""
    policy._infer = torch.compile(policy._infer, mode=mode, dynamic=False)
    return policy


def first_decision_s(policy, n: int) -> float:
    """The first decision's seconds: compiling and capturing."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    policy.plan(list(range(n)))
    policy.take_record(0)
    torch.cuda.synchronize()
    return time.perf_counter() - t


def decision_ms(policy, n: int, repeat: int = 30) -> float:
    times = []
    for r in range(repeat + 3):
        torch.cuda.synchronize()
        t = time.perf_counter()
        policy.plan(list(range(n)))
        policy.take_record(0)
        if r >= 3:
            times.append(time.perf_counter() - t)
    return 1000 * float(np.median(times))


def parts(policy, n: int) -> dict[str, dict]:
    """An eager decision's kernels under each part of the model: how many, and their summed GPU time (ms), which
    leaves out the gaps between launches that a part's wall time holds; and the kernels taking the most time."""
    from torch.profiler import ProfilerActivity, profile, record_function

    model, cuda = policy.model, policy.device.type == "cuda"
    _, inputs = policy._inputs(list(range(n)))
    noise = model.sampling_noise(n, policy.device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with torch.no_grad(), torch.autocast(policy.device.type, dtype=torch.bfloat16, enabled=cuda):
        for _ in range(2):  # warm-up: cuDNN/cuBLAS choose kernels
            model.autoencoder.decode_indices(model.sample(model.context(inputs["obs"], inputs["task_ids"]),
                                                          noise=noise, top_k=10)[0])
        sync()
        with profile(activities=activities) as prof:
            with record_function("part:encoders"):
                context = model.context(inputs["obs"], inputs["task_ids"])
            with record_function("part:sampling"):
                tokens, _ = model.sample(context, noise=noise, top_k=10)
            with record_function("part:decoder"):
                model.autoencoder.decode_indices(tokens)
            sync()
    out: dict[str, dict] = {}
    for event in prof.events():
        if event.name.startswith("part:") and event.device_type.name == "CPU":
            kernels = [k for e in descendants(event) for k in e.kernels]
            ops = sum(1 for e in descendants(event) if e.name.startswith("aten::"))
            out[event.name[5:]] = {"kernels": len(kernels), "kernel_ms": sum(k.duration for k in kernels) / 1000,
                                   "aten_ops": ops}
    top = sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)[:12]
    out["top_kernels"] = {e.key[:60]: round(e.self_device_time_total / 1000, 3) for e in top if cuda}
    return out


def descendants(event):
    for child in event.cpu_children:
        yield child
        yield from descendants(child)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--overrides", nargs="*", default=["task=metaworld_ml45_10", "device=cuda"])
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--batches", type=int, nargs="*", default=[1, 16, 64, 128])
    ap.add_argument("--layouts", nargs="*", default=["default"])
    ap.add_argument("--out", default=None)
    ap.add_argument("--compile-modes", nargs="*", default=[],
                    help="also the decision fused by torch.compile in each mode (default, max-autotune-no-cudagraphs), "
                         "then graphed")
    a = ap.parse_args()
    cfg = compose("stage1", a.overrides)
    device = resolve_device(cfg.device)
    if not device.startswith("cuda"):
        raise SystemExit("decision_speed measures a GPU decision: device=cuda")
    torch.backends.cudnn.benchmark = True
    with tempfile.TemporaryDirectory() as tmp:
        ds = demo_dataset(cfg, Path(tmp), 1, task_names(cfg.task)[: a.tasks])
        model = make_prior(cfg, ds).to(device).eval()
    task = ds.task_names[0]
    env = get_suite(str(cfg.task.suite)).make_task(task, OmegaConf.to_container(cfg.task.render), 10)
    obs = env.reset(0, render=True)
    env.close()
    settings = prior_sampling(cfg)
    result = {"device": torch.cuda.get_device_name(0), "overrides": a.overrides, "graphed_ms": {}, "eager_parts": {}}
    for layout in a.layouts:
        model.to(memory_format=torch.channels_last if layout == "channels_last" else torch.contiguous_format)
        result["graphed_ms"][layout] = {n: decision_ms(policy_with(model, settings, device, n, obs, task), n)
                                        for n in a.batches}
        for mode in a.compile_modes:
            rows = result.setdefault("compiled", {}).setdefault(layout, {}).setdefault(mode, {})
            for n in a.batches:
                torch._dynamo.reset()  # each batch size compiles afresh, as a run's one block does
                policy = compiled(policy_with(model, settings, device, n, obs, task), mode)
                first = first_decision_s(policy, n)
                rows[n] = {"first_decision_s": first, "graphed_ms": decision_ms(policy, n)}
        result["eager_parts"][layout] = {n: parts(policy_with(model, settings, device, n, obs, task, False), n)
                                         for n in a.batches}
        print(layout, json.dumps({k: result[k][layout] for k in ("graphed_ms", "compiled", "eager_parts")
                                  if k in result}), flush=True)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(a.out, "decision_speed.json"), json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
