"""The flow-matching chunk policy as a policy family: ``ript flow`` checkpoints and RL runs of them, evaluated with
the ODE (``sampling.greedy=false``: with RL's noise method), RL-fine-tuned by ``FlowLearner`` with Flow-Noise or
Flow-SDE (``configs/policy/flow.yaml``)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from ript.errors import RiptError
from ript.evaluation.results import checkpoint_results_dir
from ript.evaluation.runner import evaluate_policy
from ript.model_loader import load_model
from ript.models.flow_denoise import Denoising
from ript.policies.family import Loaded
from ript.policies.flow_policy import FlowPolicy
from ript.registry import POLICIES
from ript.rl.critic import CRITIC_FILE, load_critic
from ript.rl.flow_learner import FlowLearner
from ript.rl.objective import flow_matching_coef
from ript.utils import training
from ript.utils.checkpoint import checkpoint_config
from ript.utils.logging import log

STAGES = ("flow", "rl")
TOKEN_SAMPLING_KEYS = ("temperature", "top_k")  # the skill prior's; a flow policy samples no tokens


def denoising(policy_cfg, recorded: dict) -> Denoising:
    """RL's and evaluation's denoising: the job's ``policy`` keys, the checkpoint's step count unless set."""
    steps = policy_cfg.denoise_steps if policy_cfg.denoise_steps is not None else recorded["denoise_steps"]
    return Denoising(steps=int(steps), method=str(policy_cfg.noise_method), noise_level=float(policy_cfg.noise_level),
                     noise_std_range=tuple(float(x) for x in policy_cfg.noise_std_range),
                     sde_steps=str(policy_cfg.sde_steps), sde_first_steps=policy_cfg.get("sde_first_steps"))


def warn_unscored_steps(settings: Denoising) -> None:
    """RL scoring one of only the first n < K steps: the steps after them are never scored, and move unclipped."""
    first = settings.picked_from
    if not settings.joint and first < settings.steps:  # one stochastic step (Flow-SDE), drawn from fewer than K
        log.warning("policy.sde_first_steps=%d of %d denoise steps: RL never scores the steps after the first %d, "
                    "and they move unclipped (LIBERO-Goal, 2 demos: 50.0%% -> 30.2%% in 8 iterations, docs/flow.md); "
                    "rl.target_eval_shift bounds how far the update moves what evaluation executes", first,
                    settings.steps, first)


def decoding(cfg, ckpt: dict) -> tuple[dict, bool]:
    """(the settings the policy runs with, whether it runs the ODE): the checkpoint's action horizon and Euler
    steps with the job's overrides; the skill prior's token-sampling keys are refused, not ignored."""
    given = [k for k in TOKEN_SAMPLING_KEYS if cfg.sampling.get(k) is not None]
    if given:
        raise RiptError(f"sampling.{given[0]}={cfg.sampling[given[0]]}: a flow policy samples no tokens; its noise "
                        f"is set by policy.noise_method and policy.noise_level")
    recorded = dict(ckpt["metadata"]["sampling"])
    horizon = cfg.sampling.action_horizon if cfg.sampling.action_horizon is not None else recorded["action_horizon"]
    settings = {"action_horizon": int(horizon), "denoise_steps": denoising(cfg.policy, recorded).steps}
    return settings, cfg.sampling.greedy


@POLICIES.register("flow")
class FlowFamily:
    configs = ("flow",)

    def load(self, cfg, device: str, seed: int, rl: bool) -> Loaded:
        if not cfg.checkpoint:
            raise RiptError("policy=flow needs checkpoint=<a `ript flow` run or an RL run of one>")
        model, ckpt = load_model(cfg.checkpoint, expect_stage=STAGES, device=device)
        if ckpt["model_name"] != "flow":
            raise RiptError(f"{ckpt['checkpoint_dir']} holds a {ckpt['model_name']} model, not a flow policy")
        names = list(cfg.task_names) if cfg.task_names else model.task_names
        for name in names:
            model.task_index(name)
        if rl and not cfg.rl.train_prior_only:
            raise RiptError("rl.train_prior_only=false is the skill prior's setting; a flow policy trains what "
                            "policy.train_expert_only says (false: the prefix and encoders too)")
        settings, greedy = decoding(cfg, ckpt)
        if rl:
            warn_unscored_steps(denoising(cfg.policy, settings))
        ode = (not rl) if greedy is None else bool(greedy)
        policy = self._policy(model, cfg, settings, device, seed, deterministic=ode)
        metadata = dict(ckpt["metadata"])
        if rl:
            metadata.update(base_checkpoint=ckpt["checkpoint_dir"], sampling=settings)
        results = {"checkpoint": ckpt["checkpoint_dir"], "sampling": {**settings, "ode": ode}}
        return Loaded(model, policy, names, metadata, results, {"checkpoint": ckpt, "settings": settings})

    def _policy(self, model, cfg, settings: dict, device: str, seed: int, deterministic: bool) -> FlowPolicy:
        return FlowPolicy(model, denoising(cfg.policy, settings), int(settings["action_horizon"]), device, seed,
                          amp=device.startswith("cuda"), cuda_graph=bool(cfg.cuda_graph), deterministic=deterministic,
                          eval_noise=str(cfg.policy.eval_noise))

    def learner(self, loaded: Loaded, cfg, device: str, critic_cfg) -> FlowLearner:
        model, base = loaded.model, loaded.source["checkpoint"]
        training.fast_math(device, OmegaConf.create({"tf32": cfg.rl.tf32, "cudnn_benchmark": False,
                                                     "deterministic": False}))
        training.prepare_model(model, device, cfg.rl)
        p = cfg.policy
        learner = FlowLearner(model, denoising(p, loaded.source["settings"]), int(loaded.source["settings"]
                              ["action_horizon"]), bool(p.train_expert_only), str(p.log_prob_level), critic_cfg,
                              str(p.critic_position), regression=flow_matching_coef(cfg.rl) > 0, demos=True)
        if learner.critic is not None and (Path(base["checkpoint_dir"]) / CRITIC_FILE).is_file():
            load_critic(learner.critic, base["checkpoint_dir"])  # an RL checkpoint's critic carries on
        return learner

    def rl_checkpoint(self, loaded: Loaded, cfg) -> dict:
        return checkpoint_config("rl", "flow", loaded.source["checkpoint"]["model_kwargs"], cfg, loaded.metadata)

    def rl_evaluation(self, loaded: Loaded, learner, cfg, device: str, runner, run_dir: Path):
        settings = {**loaded.source["settings"], **{k: v for k, v in dict(cfg.eval.sampling).items()
                                                    if k == "action_horizon" and v is not None}}
        ode = True if cfg.eval.sampling.greedy is None else bool(cfg.eval.sampling.greedy)

        def evaluate(iteration: int, logger) -> None:
            evaluate_policy(runner, lambda: self._policy(loaded.model, cfg, settings, device, int(cfg.eval.seed), ode),
                            device, run_dir / "eval" / f"iter{iteration:04d}", logger, iteration,
                            f"rl iteration {iteration}", {"sampling": {**settings, "ode": ode}})
            loaded.model.eval()

        return evaluate

    def eval_output(self, loaded: Loaded, cfg) -> tuple[Path, str]:
        return checkpoint_results_dir(loaded.source["checkpoint"], cfg.out_dir, bool(cfg.overwrite))
