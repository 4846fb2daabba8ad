"""The skill prior's chunk policy as a policy family: stage-1, finetune and RL checkpoints, sampled with the
settings the checkpoint records (the job's ``sampling:`` overrides them), trained by ``ChunkLearner``."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from ript.errors import RiptError
from ript.evaluation.results import checkpoint_results_dir
from ript.evaluation.runner import evaluate_during_training
from ript.model_loader import load_model
from ript.policies.build import make_policy, sampling_settings, with_overrides
from ript.policies.family import Loaded
from ript.registry import POLICIES
from ript.rl.critic import CRITIC_FILE, load_critic
from ript.rl.learners import ChunkLearner
from ript.utils import training
from ript.utils.checkpoint import checkpoint_config

STAGES = ("stage1", "finetune", "rl")  # checkpoints holding a skill prior


@POLICIES.register("skill_prior")
class SkillPriorFamily:
    configs = ("skill_prior",)

    def load(self, cfg, device: str, seed: int, rl: bool) -> Loaded:
        if not cfg.checkpoint:
            raise RiptError("rl needs checkpoint=<stage-1, finetune or rl checkpoint>")
        model, ckpt = load_model(cfg.checkpoint, expect_stage=STAGES, device=device)
        names = list(cfg.task_names) if cfg.task_names else model.task_names
        for name in names:
            model.task_index(name)
        settings = sampling_settings(ckpt["metadata"], dict(cfg.sampling), ckpt["cfg"])
        policy = make_policy(model, settings, device, seed, bool(cfg.cuda_graph))
        metadata = ckpt["metadata"]
        if rl:
            metadata = {**metadata, "base_checkpoint": ckpt["checkpoint_dir"], "sampling": settings}
        return Loaded(model, policy, names, metadata, {"checkpoint": ckpt["checkpoint_dir"], "sampling": settings},
                      {"checkpoint": ckpt, "settings": settings})

    def learner(self, loaded: Loaded, cfg, device: str, critic_cfg) -> ChunkLearner:
        model, base = loaded.model, loaded.source["checkpoint"]
        training.fast_math(device, OmegaConf.create({"tf32": cfg.rl.tf32, "cudnn_benchmark": False,
                                                     "deterministic": False}))
        training.prepare_model(model, device, cfg.rl)  # channels-last for the rollouts' and the update's convolutions
        # not under rl.fsdp: CUDA graphs cannot hold the weights' gathers
        compiled = bool(cfg.rl.micro_batch) and training.compile_wanted(cfg.rl.compile, device) and not cfg.rl.fsdp
        learner = ChunkLearner(model, loaded.source["settings"], bool(cfg.rl.train_prior_only), critic_cfg,
                               static_batch=int(cfg.rl.micro_batch) if compiled else None, compile_scoring=compiled)
        if learner.critic is not None and (Path(base["checkpoint_dir"]) / CRITIC_FILE).is_file():
            load_critic(learner.critic, base["checkpoint_dir"])  # an RL checkpoint's critic carries on
        return learner

    def rl_checkpoint(self, loaded: Loaded, cfg) -> dict:
        return checkpoint_config("rl", "skill_prior", loaded.source["checkpoint"]["model_kwargs"], cfg,
                                 loaded.metadata)

    def rl_evaluation(self, loaded: Loaded, learner, cfg, device: str, runner, run_dir: Path):
        # a policy of its own, decoding as eval.sampling says (null keys: RL's own settings)
        settings = with_overrides(loaded.source["settings"], dict(cfg.eval.sampling))

        def evaluate(iteration: int, logger) -> None:
            evaluate_during_training(runner, loaded.model, settings, device, int(cfg.eval.seed),
                                     run_dir / "eval" / f"iter{iteration:04d}", logger, iteration,
                                     f"rl iteration {iteration}", bool(cfg.cuda_graph))

        return evaluate

    def eval_output(self, loaded: Loaded, cfg) -> tuple[Path, str]:
        return checkpoint_results_dir(loaded.source["checkpoint"], cfg.out_dir, bool(cfg.overwrite))
