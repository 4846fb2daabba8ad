"""π0 as a policy family: openpi's PyTorch checkpoint folder (or an RL run of one: its trained action expert over the
folder it started from), evaluated with the ODE and RL-fine-tuned by the flow learner with Flow-Noise or Flow-SDE,
the action expert alone training (``configs/policy/pi0.yaml``)."""

from __future__ import annotations

from pathlib import Path

from ript.config import task_names
from ript.envs.suites import get_suite, task_horizon
from ript.errors import RiptError
from ript.model_loader import load_model
from ript.models.pi0 import model_kwargs
from ript.models.pi0.official import norm_stats
from ript.policies.family import Loaded
from ript.policies.flow_family import denoising
from ript.policies.pi0_policy import Pi0Policy
from ript.policies.vla_family import VLAFamily, load_tokenizer, recorded_model
from ript.registry import MODELS, POLICIES
from ript.rl.flow_learner import FlowLearner
from ript.rl.objective import flow_matching_coef
from ript.utils.checkpoint import checkpoint_config
from ript.utils.containers import to_dict


def load_pi0(cfg, device: str):
    """(model, openpi folder): the folder's (``checkpoint=``), or an RL run's (its trained weights over its folder)."""
    if cfg.checkpoint and recorded_model(cfg.checkpoint) == "pi0":
        model, ckpt = load_model(cfg.checkpoint, expect_stage="rl", device=device)
        return model, Path(ckpt["model_kwargs"]["base_checkpoint"])
    kwargs = model_kwargs(cfg.checkpoint, cfg.policy)
    return MODELS.build("pi0", device=device, **kwargs), Path(kwargs["base_checkpoint"])


@POLICIES.register("pi0")
class Pi0Family(VLAFamily):
    configs = ("pi0",)
    eval_dir, eval_title = "runs/pi0_eval", "pi0"

    def load(self, cfg, device: str, seed: int, rl: bool) -> Loaded:
        if cfg.get("task") is None:
            raise RiptError("policy=pi0 needs task=<suite>, e.g. task=libero_spatial (its instructions and cameras)")
        model, folder = load_pi0(cfg, device)
        stats = norm_stats(folder, cfg.policy.asset_id)
        # lerobot's newer folders keep the tokenizer in a folder of its own
        default = folder / "tokenizer" if (folder / "tokenizer").is_dir() else folder
        tokenizer = load_tokenizer(Path(cfg.policy.tokenizer) if cfg.policy.tokenizer else default)
        names = task_names(cfg.task)
        metadata = {"suite": cfg.task.suite, "task_names": names,
                    "env_args": {"render": to_dict(cfg.task.render), "max_episode_steps": task_horizon(cfg.task)},
                    "base_checkpoint": str(folder.resolve())}
        instructions = get_suite(str(cfg.task.suite)).instructions(names)
        policy = self.policy(model, tokenizer, stats, instructions, cfg, device, seed, rl)
        settings = {"action_horizon": policy.action_horizon, "denoise_steps": policy.denoising.steps}
        return Loaded(model, policy, names, metadata, {"checkpoint": metadata["base_checkpoint"],
                                                       "sampling": {**settings, "ode": not rl}},
                      {"settings": settings, "action_dim": int(cfg.task.action_dim)})

    def policy(self, model, tokenizer, stats, instructions, cfg, device: str, seed: int, sample: bool) -> Pi0Policy:
        p = cfg.policy
        return Pi0Policy(model, tokenizer, stats, instructions, p, denoising(p, {"denoise_steps": 10}),
                         int(p.action_horizon), int(cfg.task.action_dim), device, seed, amp=device.startswith("cuda"),
                         cuda_graph=bool(cfg.cuda_graph), deterministic=not sample)

    def learner(self, loaded: Loaded, cfg, device: str, critic_cfg) -> FlowLearner:
        p = cfg.policy
        return FlowLearner(loaded.model, loaded.policy.denoising, loaded.policy.action_horizon,
                           bool(p.train_expert_only), str(p.log_prob_level), critic_cfg, str(p.critic_position),
                           trainable_only=True, regression=flow_matching_coef(cfg.rl) > 0)

    def rl_checkpoint(self, loaded: Loaded, cfg) -> dict:
        kwargs = model_kwargs(loaded.metadata["base_checkpoint"], cfg.policy)
        return checkpoint_config("rl", "pi0", kwargs, cfg, loaded.metadata, weights_format="trainable")
