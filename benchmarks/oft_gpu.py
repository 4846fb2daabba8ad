"""OpenVLA-OFT at full 7B size with random weights in the official layout (written here, not shipped):
load time, peak memory, batched inference latency (8 envs), and one PPO update's time and memory with LoRA.

    python -m benchmarks.oft_gpu --folder /tmp/oft7b [--out results.json]

The PPO update runs on 8 envs x 8 decisions of synthetic recorded inputs (no simulator on the GPU host):
the same learner code as ``ript oft-rl``; rollout time is the measured inference latency x decisions.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from ript.config import compose
from ript.models.openvla_oft.official import load_official
from ript.utils.atomic import atomic_write_text
from tests.helpers.official_checkpoints import LLAMA2_7B, official_config, write_official_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--folder", type=Path, default=Path("/tmp/oft7b"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    res: dict = {"device": torch.cuda.get_device_name(0)}
    t = time.perf_counter()
    if not (a.folder / "config.json").is_file():
        write_official_checkpoint(a.folder, official_config(LLAMA2_7B), "libero_spatial_no_noops", device="cuda",
                                  dtype=torch.bfloat16, words="pick up the black bowl and place it on plate".split())
    res["write_s"] = time.perf_counter() - t
    torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    model, report = load_official(a.folder, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    res["load_s"], res["load_peak_gib"] = time.perf_counter() - t, torch.cuda.max_memory_allocated() / 2**30
    res["params_b"] = sum(p.numel() for p in model.parameters()) / 1e9
    from transformers import PreTrainedTokenizerFast

    from ript.models.openvla_oft.lora import add_lora
    from ript.policies.oft_policy import OFTPolicy
    from ript.rl.learners import OFTLearner

    tok = PreTrainedTokenizerFast.from_pretrained(str(a.folder))
    stats = report["statistics"]["libero_spatial_no_noops"]
    policy = OFTPolicy(model, tok, stats, {"t": "pick up the black bowl and place it on the plate"},
                       ["agentview_rgb", "eye_in_hand_rgb"], ["ee_states", "gripper_states"], "cuda")
    b = a.batch
    inputs = {"images": torch.randint(0, 255, (b, 2, 3, 224, 224), dtype=torch.uint8, device="cuda"),
              "proprio": torch.rand(b, 8) * 2 - 1, "prompts": [policy_prompt(policy)] * b}
    with torch.no_grad():
        for _ in range(3):
            policy.forward(inputs)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        for _ in range(10):
            policy.forward(inputs)
        torch.cuda.synchronize()
    res["infer_ms_batch"] = (time.perf_counter() - t) / 10 * 1000
    res["infer_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    cfg = compose("oft", ["checkpoint=x"])
    add_lora(model, cfg.policy.lora)
    model.add_scale_head(256, 0.1).to("cuda", torch.float32)
    learner = OFTLearner(model, grad_checkpointing=True, train_action_head=False)
    learner.attach(policy)
    res["trainable_m"] = sum(p.numel() for p in learner.params) / 1e6
    n = 8 * b  # 8 envs x 8 decisions
    data = {"images": inputs["images"].cpu().repeat(8, 1, 1, 1, 1), "proprio": inputs["proprio"].repeat(8, 1),
            "prompts": inputs["prompts"] * 8, "actions": torch.rand(n, 8, 7, device="cuda") * 2 - 1,
            "old_log_probs": torch.zeros(n, 56, device="cuda")}
    opt = torch.optim.AdamW(learner.params, lr=1e-5)
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for idx in torch.arange(n, device="cuda").split(b):
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            lp = learner.score(data, idx).log_probs
        (-(lp.float().mean())).backward()
        opt.step()
    torch.cuda.synchronize()
    res[f"ppo_update_s_{n}_decisions_mb{b}"] = time.perf_counter() - t
    res["train_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    print(json.dumps(res, indent=2))
    if a.out:
        atomic_write_text(Path(a.out), json.dumps(res, indent=2))


def policy_prompt(policy) -> list[int]:
    from ript.policies.oft_policy import prompt_ids

    return prompt_ids(policy.tokenizer, policy.instructions["t"])


if __name__ == "__main__":
    main()
