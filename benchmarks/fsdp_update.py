"""One PPO update of OpenVLA-OFT sharded with FSDP over the processes torchrun starts (``ript.utils.fsdp``): time
and peak GPU memory per rank, full fine-tuning (every weight trains, ``--full``) or LoRA. Random weights in the
official layout (7B, or tiny with ``--tiny``); the decisions are the policy's own samples on random camera frames
and states (an update's cost does not depend on what the frames show), the same on every rank, with a fixed +-1
advantage pattern.

    torchrun --nproc_per_node 2 -m benchmarks.fsdp_update --folder /tmp/oft7b_mw --full [--decisions 64] [--out f.json]
    python -m benchmarks.fsdp_update --tiny --device cpu --no-fsdp --save-weights one.safetensors   # one process

With the same decisions on every rank, the ranks' averaged gradient is the one-process gradient, so
``--save-weights`` (the trained weights, gathered whole) of a sharded run matches the one-process run's.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from ript.config import compose
from ript.envs.metaworld import ROBOT_STATE_DIM
from ript.models.openvla_oft.lora import add_lora
from ript.policies.families import family_for
from ript.rl.learners import OFTLearner, shard_learner
from ript.rl.update import make_optimizer, ppo_update
from ript.utils import distributed as ddist
from ript.utils.atomic import atomic_write_text
from ript.utils.fsdp import whole_state
from tests.helpers.official_checkpoints import (
    LLAMA2_7B,
    TINY_TEXT,
    TINY_VISION,
    official_config,
    write_official_checkpoint,
)

TASKS = ["reach-v3", "button-press-v3"]


def write_folder(folder: Path, tiny: bool, device: str) -> None:
    config = official_config(TINY_TEXT, image_size=28, vision_overrides=TINY_VISION) if tiny else \
        official_config(LLAMA2_7B)
    write_official_checkpoint(folder, config, "metaworld", device=device,
                              dtype=torch.float32 if tiny else torch.bfloat16, action_dim=4, proprio_dim=4,
                              words="reach the goal press button".split())


def sampled_decisions(policy, n: int, image_size: int) -> list[dict]:
    """The policy's own recorded decisions on random frames and states (seeded: the same on every rank)."""
    rng = np.random.default_rng(0)
    policy.reset(n)
    for i in range(n):
        policy.reset_env(i, TASKS[i % len(TASKS)], i)
        policy.observe(i, {"corner_rgb": rng.integers(0, 256, (image_size, image_size, 3), dtype=np.uint8),
                           "robot_states": rng.normal(size=ROBOT_STATE_DIM).astype(np.float32)})
    policy.act_chunk([True] * n)
    return [policy.take_record(i)[0] for i in range(n)]


def peak_gib(device: str) -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--folder", type=Path, default=Path("/tmp/oft7b_mw"))
    ap.add_argument("--tiny", action="store_true", help="a tiny checkpoint instead of 7B")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--full", action="store_true", help="full fine-tuning (default: LoRA and the heads)")
    ap.add_argument("--no-fsdp", action="store_true", help="every rank holds the whole model (DDP-style)")
    ap.add_argument("--decisions", type=int, default=64)
    ap.add_argument("--overrides", nargs="*", default=[], help="rl.* settings (epochs, minibatches, micro_batch)")
    ap.add_argument("--save-weights", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    device, info = ddist.init_rank(a.device)
    cuda = device.startswith("cuda")
    if info.is_main and not (a.folder / "config.json").is_file():
        write_folder(a.folder, a.tiny, device)
    ddist.barrier(info)
    fsdp = not a.no_fsdp and info.world_size > 1
    cfg = compose("oft", [f"checkpoint={a.folder}", "task=metaworld_ml45", f"task.task_names=[{','.join(TASKS)}]",
                          "task.render.cameras=[corner]", "policy.image_keys=[corner_rgb]",
                          "policy.proprio_keys=[robot_states]", "policy.gripper=none", "policy.center_crop=false",
                          f"device={a.device}", *a.overrides])
    torch.manual_seed(0)  # the heads' initialisation: the same on every rank and in a one-process run
    loaded = family_for(cfg).load(cfg, device, 0, rl=True)
    model, policy = loaded.model, loaded.policy
    if not a.full:
        add_lora(model, cfg.policy.lora)
    head = next(model.action_head.parameters())
    model.add_scale_head(int(cfg.policy.scale_head_hidden), float(cfg.policy.init_scale)).to(head.device, head.dtype)
    learner = OFTLearner(model, bool(cfg.policy.gradient_checkpointing) and cuda, False, full_finetune=a.full)
    learner.attach(policy)
    res = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "ranks": info.world_size, "fsdp": fsdp,
           "full_finetune": a.full, "decisions": a.decisions,
           "trainable_m": sum(p.numel() for p in learner.params) / 1e6,
           "ppo": {k: cfg.rl[k] for k in ("epochs", "minibatches", "micro_batch")}}
    with torch.no_grad():
        decisions = sampled_decisions(policy, a.decisions, int(cfg.task.render.image_size))
    data = learner.collate(decisions, device)
    data["advantages"] = torch.tensor([1.0, -1.0], device=device).repeat(a.decisions // 2 + 1)[: a.decisions]
    if fsdp:
        shard_learner(learner)
    opt, sched = make_optimizer(learner, cfg, device)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    stats = ppo_update(learner, opt, sched, data, cfg, info, 0, device, sharded=fsdp)
    if cuda:
        torch.cuda.synchronize()
    rank_figures = ddist.gather_objects({"update_s": time.perf_counter() - t, "peak_gib": peak_gib(device)}, info)
    weights = whole_state(learner.weights.state_dict())  # every rank gathers, in one order
    if info.is_main:
        res.update(per_rank=rank_figures, update_s=max(r["update_s"] for r in rank_figures),
                   policy_loss=stats["policy_loss"], grad_norm=stats["grad_norm"])
        print(json.dumps(res, indent=2))
        if a.out:
            atomic_write_text(Path(a.out), json.dumps(res, indent=2))
        if a.save_weights:
            from safetensors.torch import save_file

            save_file({k: v.contiguous() for k, v in weights.items()}, str(a.save_weights))
    ddist.barrier(info)


if __name__ == "__main__":
    main()
