"""OpenVLA-OFT and the original OpenVLA: evaluate an official checkpoint folder on our runners, and RL-fine-tune
it with LoRA through the RL stage's loop (same dynamic sampling, PPO, metrics, checkpoints, resume): OFT with a
Laplace scale head, OpenVLA as a Categorical policy over its action bins. The folder tells which it is.

    ript oft-eval checkpoint=<official folder> task=libero_spatial
    ript oft-rl checkpoint=<official folder> task=libero_spatial run_dir=runs/oft_rl
    ript oft-eval adapter=runs/oft_rl task=libero_spatial   # after RL (the base folder is the one RL started from)

RL checkpoints hold only what RL trains (LoRA adapters + heads), next to a pointer to the official folder.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ript.config import resolve_device, task_names, to_dict
from ript.envs.evaluation import evaluate_policy, make_runner, results_dir, write_evaluation
from ript.envs.runner import success_table
from ript.envs.seeds import rank_seed
from ript.envs.suites import get_suite, task_horizon
from ript.errors import RiptError
from ript.model_loader import load_model
from ript.models.openvla_oft import model_kwargs
from ript.models.openvla_oft.lora import add_lora
from ript.models.openvla_oft.official import dataset_statistics, pick_statistics
from ript.models.openvla.model import OpenVLA
from ript.policies.oft_policy import OFTPolicy
from ript.policies.openvla_policy import OpenVLAPolicy
from ript.rl.advantages import build_estimator
from ript.rl.learners import OFTLearner, OpenVLALearner
from ript.rl.loop import RLRun, init_rank, prepare_run, train_loop
from ript.registry import MODELS
from ript.utils.checkpoint import checkpoint_config, read_checkpoint_config, resolve_checkpoint_dir
from ript.utils.logging import log, setup_console_logging


def load(cfg, device: str) -> tuple[torch.nn.Module, Path]:
    """(model, official folder): the official folder's (``checkpoint=``), or an RL checkpoint's (``adapter=``: its base folder,
    recorded in the checkpoint, with its LoRA adapter and heads merged) through the model loader."""
    if not cfg.adapter:
        name, kwargs = model_kwargs(cfg)
        log.info("oft: %s holds %s", kwargs["base_checkpoint"], "an OpenVLA-OFT checkpoint (OFT's action head file)"
                 if name == "openvla_oft" else "an original OpenVLA checkpoint (no OFT action head file)")
        return MODELS.build(name, device=device, **kwargs), Path(kwargs["base_checkpoint"])
    config = read_checkpoint_config(resolve_checkpoint_dir(cfg.adapter))
    if config.get("model_name") not in ("openvla_oft", "openvla"):
        raise RiptError(f"adapter={cfg.adapter}: a checkpoint of {config.get('model_name')!r}, not an OpenVLA(-OFT) RL "
                        f"run (evaluate it with `ript eval`)")
    model, ckpt = load_model(cfg.adapter, expect_stage="rl", device=device)
    base = ckpt["model_kwargs"]["base_checkpoint"]
    if cfg.checkpoint and Path(cfg.checkpoint).resolve() != Path(base):
        raise RiptError(f"adapter={cfg.adapter} was trained on {base}, not on checkpoint={cfg.checkpoint}")
    return model, Path(base)


def build(cfg, device: str, seed: int, sample: bool):
    """(model, policy, metadata, names) for a config."""
    model, folder = load(cfg, device)
    stats = pick_statistics(dataset_statistics(folder), cfg.task.suite, cfg.oft.unnorm_key, str(folder))
    from transformers import PreTrainedTokenizerFast

    try:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder))
    except (OSError, ValueError) as e:
        raise RiptError(f"{folder}: cannot load the tokenizer (tokenizer.json): {e}") from None
    names = task_names(cfg.task)
    metadata = {"suite": cfg.task.suite, "task_names": names,
                "env_args": {"render": to_dict(cfg.task.render), "max_episode_steps": task_horizon(cfg.task)},
                "base_checkpoint": str(folder.resolve())}
    instructions = get_suite(str(cfg.task.suite)).instructions(names)
    if isinstance(model, OpenVLA):  # the original OpenVLA: one image, one action of discrete tokens per decision
        policy = OpenVLAPolicy(model, tokenizer, stats, instructions, list(cfg.oft.image_keys), device,
                               bool(cfg.oft.center_crop), str(cfg.oft.gripper), sample=sample, seed=seed,
                               amp=device.startswith("cuda"), temperature=float(cfg.oft.temperature))
    else:
        policy = OFTPolicy(model, tokenizer, stats, instructions, list(cfg.oft.image_keys), list(cfg.oft.proprio_keys),
                           device, cfg.oft.action_horizon, bool(cfg.oft.center_crop), str(cfg.oft.gripper),
                           sample=sample, seed=seed, amp=device.startswith("cuda"))
    return model, policy, metadata, names


def run_eval(cfg) -> dict:
    setup_console_logging()
    device = resolve_device(cfg.device)
    model, policy, metadata, names = build(cfg, device, int(cfg.seed), sample=False)
    runner = make_runner(metadata, names, cfg.eval, cfg.workers)
    out_dir = results_dir(Path(cfg.out_dir or "runs/oft_eval"), bool(cfg.overwrite))
    try:
        torch.manual_seed(int(cfg.seed))
        results = runner.run(policy, video_dir=out_dir / "videos")
    finally:
        runner.close()
    results.update(checkpoint=metadata["base_checkpoint"], adapter=cfg.adapter)
    write_evaluation(out_dir, results, "OpenVLA-OFT")
    print(success_table(results))
    return results


def run_rl(cfg) -> str:
    device, info = init_rank(cfg)  # first: the 7B model is built on this rank's device
    model, policy, metadata, names = build(cfg, device, rank_seed(int(cfg.seed), info.rank), sample=True)
    run_dir, resume_from = prepare_run(cfg, info)
    add_lora(model, cfg.lora)
    critic_cfg = cfg.rl.critic if build_estimator(cfg.rl).uses_critic else None
    if isinstance(model, OpenVLA):  # a Categorical policy over the bins: no scale head
        learner = OpenVLALearner(model, bool(cfg.oft.gradient_checkpointing), critic_cfg)
    else:
        p = next(model.action_head.parameters())
        model.add_scale_head(int(cfg.oft.scale_head_hidden), float(cfg.oft.init_scale)).to(p.device, torch.float32)
        learner = OFTLearner(model, bool(cfg.oft.gradient_checkpointing), bool(cfg.oft.train_action_head), critic_cfg)
    learner.attach(policy)
    name, kwargs = model_kwargs(cfg)
    ckpt_config = checkpoint_config("rl", name, kwargs, cfg, metadata, weights_format="adapter")
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

