"""Which policy family a checkpoint holds, by name: a ript checkpoint's recorded ``model_name`` (stage 1,
finetune and RL record it), or an official OpenVLA(-OFT) folder's contents. Importing this module declares every
family in ``ript.registry.POLICIES``; a family's module (the VLA ones bring transformers) is imported when the
family is first asked for."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from ript.errors import RiptError
from ript.models.openvla_oft import model_family
from ript.policies.family import PolicyFamily
from ript.registry import POLICIES
from ript.utils.checkpoint import read_checkpoint_config, resolve_checkpoint_dir

POLICIES.declare({"skill_prior": "ript.policies.skill_prior_family", "flow": "ript.policies.flow_family",
                  "pi0": "ript.policies.pi0_family", "openvla_oft": "ript.policies.vla_family",
                  "openvla": "ript.policies.vla_family"})


def checkpoint_model(path: str) -> str | None:
    """The model a checkpoint holds: its recorded ``model_name``; for an official OpenVLA(-OFT) folder (its
    config.json names ``n_action_bins``), which of the two it is. None where neither can be read (a missing or
    damaged checkpoint: the loader of the job's ``policy`` family then names the problem)."""
    try:
        config = read_checkpoint_config(resolve_checkpoint_dir(path))
    except RiptError:
        return None
    if "model_name" in config:
        return config["model_name"]
    if "paligemma_variant" in config:  # openpi's π0 folder
        return "pi0"
    return model_family(Path(path)) if "n_action_bins" in config else None


def family_for(cfg) -> PolicyFamily:
    """The family of the job's checkpoint (that of ``cfg.policy.name`` when the checkpoint names none the registry
    knows, e.g. a stage-0 checkpoint: its loader then says what is wrong); refused when the ``policy`` config's
    keys are not the ones that family reads."""
    source = OmegaConf.select(cfg, "adapter") or cfg.checkpoint  # the oft job's adapter= is an RL checkpoint
    model = checkpoint_model(str(source)) if source else None
    name = model if model in POLICIES.names() else str(cfg.policy.name)
    family = POLICIES.get(name)()
    if cfg.policy.name not in family.configs:
        raise RiptError(f"checkpoint {source} holds the {name} policy family's model; run it with "
                        f"policy={family.configs[0]}")
    return family
