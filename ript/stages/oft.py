"""OpenVLA-OFT: evaluate an official checkpoint folder on our runners, and RL-fine-tune it with LoRA and a
Laplace scale head through the RL stage's loop (same dynamic sampling, PPO, metrics, checkpoints, resume).

    ript oft-eval checkpoint=<official folder> task=libero_spatial
    ript oft-rl checkpoint=<official folder> task=libero_spatial run_dir=runs/oft_rl
    ript oft-eval checkpoint=<official folder> adapter=runs/oft_rl task=libero_spatial   # after RL

RL checkpoints hold only what RL trains (LoRA adapters + heads), next to a pointer to the official folder.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ript.config import resolve_device, task_names, to_dict
from ript.envs.evaluation import evaluate_policy, make_runner
from ript.envs.runner import success_table, write_results
from ript.envs.seeds import rank_seed
from ript.envs.suites import get_suite, task_horizon
from ript.errors import RiptError
from ript.models.openvla_oft.lora import add_lora, load_adapter
from ript.models.openvla_oft.official import load_official, pick_statistics
from ript.policies.oft_policy import OFTPolicy
from ript.rl.learners import OFTLearner
from ript.rl.loop import RLRun, init_rank, prepare_run, train_loop
from ript.utils.checkpoint import checkpoint_config, resolve_checkpoint_dir
from ript.utils.logging import log, setup_console_logging

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}


def build(cfg, device: str, seed: int, sample: bool):
    """(model, policy, metadata, names) for a config: the official folder, optional RL adapter."""
    if not cfg.checkpoint:
        raise RiptError("checkpoint=<official OpenVLA-OFT folder> is required")
    dtype = DTYPES.get(str(cfg.oft.dtype))
    if dtype is None:
        raise RiptError(f"oft.dtype must be one of {', '.join(DTYPES)}, not {cfg.oft.dtype!r}")
    if device == "cpu" and dtype != torch.float32:
        dtype = torch.float32  # CPUs: full precision
    model, report = load_official(cfg.checkpoint, device=device, dtype=dtype, chunk_size=cfg.oft.chunk_size,
                                  attention=cfg.oft.attention, num_images=len(cfg.oft.image_keys))
    log.info("oft: loaded %s in %.1f s (%d official keys unused by design)", cfg.checkpoint, report["seconds"],
             report["unused_keys"])
    stats = pick_statistics(report["statistics"], cfg.task.suite, cfg.oft.unnorm_key, str(cfg.checkpoint))
    from transformers import PreTrainedTokenizerFast

    try:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(cfg.checkpoint))
    except (OSError, ValueError) as e:
        raise RiptError(f"{cfg.checkpoint}: cannot load the tokenizer (tokenizer.json): {e}") from None
    names = task_names(cfg.task)
    metadata = {"suite": cfg.task.suite, "task_names": names,
                "env_args": {"render": to_dict(cfg.task.render), "max_episode_steps": task_horizon(cfg.task)},
                "base_checkpoint": str(Path(cfg.checkpoint).resolve())}
    policy = OFTPolicy(model, tokenizer, stats, get_suite(str(cfg.task.suite)).instructions(names), list(cfg.oft.image_keys),
                       list(cfg.oft.proprio_keys), device, cfg.oft.action_horizon, bool(cfg.oft.center_crop),
                       str(cfg.oft.gripper), sample=sample, seed=seed, amp=device.startswith("cuda"))
    return model, policy, metadata, names


def run_eval(cfg) -> dict:
    setup_console_logging()
    device = resolve_device(cfg.device)
    model, policy, metadata, names = build(cfg, device, int(cfg.seed), sample=False)
    if cfg.adapter:
        ckpt = resolve_checkpoint_dir(cfg.adapter)
        load_adapter(model, ckpt / "adapter", merge=True)
        policy.model = model
    runner = make_runner(metadata, names, cfg.eval, cfg.workers)
    out_dir = Path(cfg.out_dir or "runs/oft_eval")
    try:
        torch.manual_seed(int(cfg.seed))
        results = runner.run(policy, video_dir=out_dir / "videos")
    finally:
        runner.close()
    results.update(checkpoint=str(cfg.checkpoint), adapter=cfg.adapter)
    write_results(out_dir / "results.json", results)
    print(success_table(results))
    return results


def run_rl(cfg) -> str:
    device, info = init_rank(cfg)  # first: the 7B model is built on this rank's device
    model, policy, metadata, names = build(cfg, device, rank_seed(int(cfg.seed), info.rank), sample=True)
    run_dir, resume_from = prepare_run(cfg, info)
    add_lora(model, cfg.lora)
    p = next(model.action_head.parameters())
    model.add_scale_head(int(cfg.oft.scale_head_hidden), float(cfg.oft.init_scale)).to(p.device, torch.float32)
    learner = OFTLearner(model, bool(cfg.oft.gradient_checkpointing), bool(cfg.oft.train_action_head))
    learner.policy = policy
    ckpt_config = checkpoint_config("rl", "openvla_oft", {}, cfg, metadata)
    eval_runner = make_runner(metadata, names, cfg.eval, cfg.workers) if info.is_main and cfg.eval.every else None

    def evaluate(iteration: int, logger) -> None:
        if eval_runner is None:
            return
        policy.sample, policy.record = False, False  # the L1 head's mean, as OFT evaluates
        try:
            evaluate_policy(eval_runner, lambda: policy, device, run_dir / "eval" / f"iter{iteration:04d}", logger,
                            iteration, f"rl iteration {iteration}")
        finally:
            policy.sample, policy.record = True, True

    try:
        out = train_loop(RLRun(cfg, info, device, learner, policy, names, metadata, ckpt_config, run_dir,
                               resume_from, evaluate))
    finally:
        if eval_runner is not None:
            eval_runner.close()
    return out

