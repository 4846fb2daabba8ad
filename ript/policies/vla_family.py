"""OpenVLA-OFT and the original OpenVLA as policy families: an official checkpoint folder (or an RL run of one:
its LoRA adapter and heads over the folder it started from), evaluated deterministically (the L1 head's mean,
the bins' argmax) and RL-fine-tuned with LoRA: OFT with a Laplace scale head, OpenVLA as a Categorical policy
over its action bins. The folder's contents tell which model it holds (``model_family``); both read the keys of
``configs/policy/openvla_oft.yaml`` (``policy=openvla`` is the same with the original's one-image defaults).

RL checkpoints hold only what RL trains (LoRA adapters + heads), next to a pointer to the official folder.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import torch
from omegaconf import OmegaConf

from ript.config import task_names
from ript.envs.suites import get_suite, task_horizon
from ript.errors import RiptError
from ript.evaluation.results import results_dir
from ript.evaluation.runner import evaluate_policy
from ript.model_loader import load_model
from ript.models.openvla_oft import model_kwargs
from ript.models.openvla_oft.lora import add_lora
from ript.models.openvla_oft.official import dataset_statistics, pick_statistics
from ript.policies.family import Loaded
from ript.policies.oft_policy import OFTPolicy
from ript.policies.openvla_policy import OpenVLAPolicy
from ript.registry import MODELS, POLICIES
from ript.rl.learners import OFTLearner, OpenVLALearner
from ript.utils.checkpoint import (
    checkpoint_config,
    read_checkpoint_config,
    resolve_checkpoint_dir,
)
from ript.utils.containers import to_dict
from ript.utils.logging import log

VLA_MODELS = ("openvla_oft", "openvla")  # what an RL run of either records as its model
DEFAULT_EVAL_DIR = "runs/oft_eval"


def adapter_of(cfg) -> str | None:
    """The RL run whose adapter to apply: the ``oft`` job's ``adapter=``, or a ``checkpoint=`` that is one."""
    adapter = OmegaConf.select(cfg, "adapter")
    if adapter:
        return str(adapter)
    return str(cfg.checkpoint) if cfg.checkpoint and recorded_model(cfg.checkpoint) else None


def recorded_model(path: str) -> str | None:
    """The model a ript checkpoint records; None for anything else (an official folder's config.json names none)."""
    try:
        return read_checkpoint_config(resolve_checkpoint_dir(path)).get("model_name")
    except RiptError:
        return None


def load_model_and_folder(cfg, device: str) -> tuple[torch.nn.Module, Path]:
    """(model, official folder): the official folder's (``checkpoint=``), or an RL checkpoint's (its base folder,
    recorded in the checkpoint, with its LoRA adapter and heads merged) through the model loader."""
    adapter = adapter_of(cfg)
    if adapter is None:
        name, kwargs = model_kwargs(cfg.checkpoint, cfg.policy)
        log.info("oft: %s holds %s", kwargs["base_checkpoint"], "an OpenVLA-OFT checkpoint (OFT's action head file)"
                 if name == "openvla_oft" else "an original OpenVLA checkpoint (no OFT action head file)")
        return MODELS.build(name, device=device, **kwargs), Path(kwargs["base_checkpoint"])
    config = read_checkpoint_config(resolve_checkpoint_dir(adapter))
    if config.get("model_name") not in VLA_MODELS:
        raise RiptError(f"adapter={adapter}: a checkpoint of {config.get('model_name')!r}, not an OpenVLA(-OFT) RL "
                        f"run (evaluate it with `ript eval`)")
    model, ckpt = load_model(adapter, expect_stage="rl", device=device)
    base = ckpt["model_kwargs"]["base_checkpoint"]
    if cfg.checkpoint and cfg.checkpoint != adapter and Path(cfg.checkpoint).resolve() != Path(base):
        raise RiptError(f"adapter={adapter} was trained on {base}, not on checkpoint={cfg.checkpoint}")
    return model, Path(base)


def load_tokenizer(folder: Path):
    from transformers import PreTrainedTokenizerFast

    try:
        return PreTrainedTokenizerFast.from_pretrained(str(folder))
    except (OSError, ValueError) as e:
        raise RiptError(f"{folder}: cannot load the tokenizer (tokenizer.json): {e}") from None


class VLAFamily(ABC):
    """What OpenVLA-OFT and OpenVLA (and π0) share; each subclass builds its own policy and learner."""
    eval_dir, eval_title = DEFAULT_EVAL_DIR, "OpenVLA-OFT"  # an evaluation's results folder without out_dir

    def load(self, cfg, device: str, seed: int, rl: bool) -> Loaded:
        if OmegaConf.select(cfg, "task") is None:
            raise RiptError(f"policy={cfg.policy.name} needs task=<suite>, e.g. task=libero_spatial (its instructions "
                            f"and the dataset statistics to un-normalise with)")
        model, folder = load_model_and_folder(cfg, device)
        stats = pick_statistics(dataset_statistics(folder), cfg.task.suite, cfg.policy.unnorm_key, str(folder))
        tokenizer = load_tokenizer(folder)
        names = task_names(cfg.task)
        metadata = {"suite": cfg.task.suite, "task_names": names,
                    "env_args": {"render": to_dict(cfg.task.render), "max_episode_steps": task_horizon(cfg.task)},
                    "base_checkpoint": str(folder.resolve())}
        instructions = get_suite(str(cfg.task.suite)).instructions(names)
        policy = self.policy(model, tokenizer, stats, instructions, cfg.policy, device, seed, rl)
        return Loaded(model, policy, names, metadata,
                      {"checkpoint": metadata["base_checkpoint"], "adapter": adapter_of(cfg)})

    @abstractmethod
    def policy(self, model, tokenizer, stats, instructions, policy_cfg, device: str, seed: int, sample: bool):
        """The family's policy on ``model``: sampling (RL) or deterministic."""

    @abstractmethod
    def learner(self, loaded: Loaded, cfg, device: str, critic_cfg):
        """LoRA on the model, and the learner that trains it."""

    def rl_checkpoint(self, loaded: Loaded, cfg) -> dict:
        name, kwargs = model_kwargs(cfg.checkpoint, cfg.policy)
        return checkpoint_config("rl", name, kwargs, cfg, loaded.metadata, weights_format="adapter")

    def rl_evaluation(self, loaded: Loaded, learner, cfg, device: str, runner, run_dir: Path):
        policy = loaded.policy

        def evaluate(iteration: int, logger) -> None:
            policy.set_deterministic(True)  # as the family evaluates
            policy.stop_recording()
            try:
                evaluate_policy(runner, lambda: policy, device, run_dir / "eval" / f"iter{iteration:04d}", logger,
                                iteration, f"rl iteration {iteration}")
            finally:
                policy.set_deterministic(False)
                learner.attach(policy)

        return evaluate

    def eval_output(self, loaded: Loaded, cfg) -> tuple[Path, str]:
        return results_dir(Path(cfg.out_dir or self.eval_dir), bool(cfg.overwrite)), self.eval_title


@POLICIES.register("openvla_oft")
class OpenVLAOFTFamily(VLAFamily):
    configs = ("openvla_oft",)  # OFT reads proprio and two images: the original's defaults do not fit it

    def policy(self, model, tokenizer, stats, instructions, policy_cfg, device: str, seed: int, sample: bool):
        return OFTPolicy(model, tokenizer, stats, instructions, list(policy_cfg.image_keys),
                         list(policy_cfg.proprio_keys), device, policy_cfg.action_horizon,
                         bool(policy_cfg.center_crop), str(policy_cfg.gripper), sample=sample, seed=seed,
                         amp=device.startswith("cuda"))

    def learner(self, loaded: Loaded, cfg, device: str, critic_cfg) -> OFTLearner:
        model, policy_cfg = loaded.model, cfg.policy
        add_lora(model, policy_cfg.lora)
        p = next(model.action_head.parameters())
        model.add_scale_head(int(policy_cfg.scale_head_hidden), float(policy_cfg.init_scale)).to(p.device,
                                                                                                  torch.float32)
        return OFTLearner(model, bool(policy_cfg.gradient_checkpointing), bool(policy_cfg.train_action_head),
                          critic_cfg)


@POLICIES.register("openvla")
class OpenVLAFamily(VLAFamily):
    """One image, one action of discrete tokens per decision."""
    configs = ("openvla", "openvla_oft")  # it reads a subset of OFT's keys: the oft job runs either folder

    def policy(self, model, tokenizer, stats, instructions, policy_cfg, device: str, seed: int, sample: bool):
        return OpenVLAPolicy(model, tokenizer, stats, instructions, list(policy_cfg.image_keys), device,
                             bool(policy_cfg.center_crop), str(policy_cfg.gripper), sample=sample, seed=seed,
                             amp=device.startswith("cuda"), temperature=float(policy_cfg.temperature))

    def learner(self, loaded: Loaded, cfg, device: str, critic_cfg) -> OpenVLALearner:
        add_lora(loaded.model, cfg.policy.lora)
        return OpenVLALearner(loaded.model, bool(cfg.policy.gradient_checkpointing), critic_cfg)

