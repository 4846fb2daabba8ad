"""Which policy family a checkpoint holds, by name: a ript checkpoint's recorded ``model_name`` (stage 1,
finetune and RL record it), or an official OpenVLA(-OFT) folder's contents. Importing this module registers
every family in ``ript.registry.POLICIES``."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

import ript.policies.skill_prior_family  # noqa: F401  (registers skill_prior)
import ript.policies.vla_family  # noqa: F401  (registers openvla_oft, openvla)
from ript.errors import RiptError
from ript.models.openvla_oft import model_family
from ript.policies.family import PolicyFamily
from ript.policies.vla_family import recorded_model
from ript.registry import POLICIES


def checkpoint_model(path: str) -> str | None:
    """The model a checkpoint holds: its recorded ``model_name``, or for a folder of another layout with the
    official files, which OpenVLA it is. None for a path that is neither (the family's loader names the problem)."""
    recorded = recorded_model(path)
    if recorded is not None:
        return recorded
    folder = Path(path)
    return model_family(folder) if (folder / "config.json").is_file() else None


def family_for(cfg) -> PolicyFamily:
    """The family of the job's checkpoint (that of ``cfg.policy.name`` when the checkpoint names none the registry
    knows, e.g. a stage-0 checkpoint: its loader then says what is wrong); refused when the ``policy`` config's
    keys are not the ones that family reads."""
    source = OmegaConf.select(cfg, "adapter") or cfg.checkpoint  # the oft job's adapter= is an RL checkpoint
    model = checkpoint_model(str(source)) if source else None
    name = model if model in POLICIES.names() else str(cfg.policy.name)
    family = POLICIES.get(name)()
    if cfg.policy.name not in family.configs:
        raise RiptError(f"checkpoint {source} holds the {name} policy family's model; run it with policy={family.configs[0]}")
    return family
