"""``ript rl``: RL fine-tuning of a chunk policy: leave-one-out PPO from sparse success rewards (RIPT) with
dynamic sampling, or PPO with a learned critic (GAE, sparse or dense rewards) (``ript/rl/``: rollouts, the
update, the loop), on a stage-1, finetune or RL checkpoint.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from ript.envs.evaluation import evaluate_during_training, make_runner
from ript.envs.seeds import rank_seed
from ript.errors import RiptError
from ript.model_loader import load_model
from ript.policies.build import make_policy, sampling_settings, with_overrides
from ript.rl.advantages import build_estimator
from ript.rl.critic import CRITIC_FILE, load_critic
from ript.rl.learners import ChunkLearner
from ript.rl.loop import RLRun, init_rank, prepare_run, train_loop
from ript.utils import training
from ript.utils.checkpoint import checkpoint_config


def run(cfg) -> str:
    if not cfg.checkpoint:
        raise RiptError("rl needs checkpoint=<stage-1, finetune or rl checkpoint>")
    device, info = init_rank(cfg)
    model, base = load_model(cfg.checkpoint, expect_stage=("stage1", "finetune", "rl"), device=device)
    run_dir, resume_from = prepare_run(cfg, info)
    names = list(cfg.task_names) if cfg.task_names else model.task_names
    for name in names:
        model.task_index(name)
    settings = sampling_settings(base["metadata"], dict(cfg.sampling), base["cfg"])
    critic_cfg = cfg.rl.critic if build_estimator(cfg.rl).uses_critic else None
    training.fast_math(device, OmegaConf.create({"tf32": cfg.rl.tf32, "cudnn_benchmark": False,
                                                 "deterministic": False}))
    training.prepare_model(model, device, cfg.rl)  # channels-last for the rollouts' and the update's convolutions
    compiled = bool(cfg.rl.micro_batch) and training.compile_wanted(cfg.rl.compile, device)
    learner = ChunkLearner(model, settings, bool(cfg.rl.train_prior_only), critic_cfg,
                           static_batch=int(cfg.rl.micro_batch) if compiled else None, compile_scoring=compiled)
    if learner.critic is not None and (Path(base["checkpoint_dir"]) / CRITIC_FILE).is_file():
        load_critic(learner.critic, base["checkpoint_dir"])  # an RL checkpoint's critic carries on
    policy = make_policy(model, settings, device, rank_seed(int(cfg.seed), info.rank), bool(cfg.cuda_graph))
    learner.attach(policy)
    metadata = {**base["metadata"], "base_checkpoint": base["checkpoint_dir"], "sampling": settings}
    ckpt_config = checkpoint_config("rl", "skill_prior", base["model_kwargs"], cfg, metadata)
    eval_runner = make_runner(metadata, names, cfg.eval, cfg.workers) if info.is_main and cfg.eval.every else None
    eval_settings = with_overrides(settings, dict(cfg.eval.sampling))

    def evaluate(iteration: int, logger) -> None:
        if eval_runner is not None:
            evaluate_during_training(eval_runner, model, eval_settings, device, int(cfg.eval.seed),
                                     run_dir / "eval" / f"iter{iteration:04d}", logger, iteration,
                                     f"rl iteration {iteration}", bool(cfg.cuda_graph))

    try:
        return train_loop(RLRun(cfg, info, device, learner, policy, names, metadata, ckpt_config, run_dir,
                                resume_from, evaluate))
    finally:
        if eval_runner is not None:
            eval_runner.close()
