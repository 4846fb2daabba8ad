"""π0 in the model registry. Its weights live in openpi's checkpoint folder, so a ript checkpoint of it (RL) records
the folder as ``model_kwargs`` and keeps only what RL trained (``weights_format: trainable``)."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ript.errors import RiptError
from ript.models.pi0.model import GEMMA_VARIANTS, VOCAB, Pi0Model
from ript.models.pi0.official import load_weights, read_config
from ript.registry import MODELS
from ript.utils.logging import log

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def model_kwargs(checkpoint: str | None, policy_cfg) -> dict:
    """What rebuilds the model of an openpi folder with a ``policy`` config's keys."""
    if not checkpoint:
        raise RiptError("checkpoint=<an openpi PyTorch π0 folder> is required")
    if str(policy_cfg.dtype) not in DTYPES:
        raise RiptError(f"policy.dtype must be one of {', '.join(DTYPES)}, not {policy_cfg.dtype!r}")
    folder = Path(checkpoint).resolve()
    config = read_config(folder)
    for key in ("paligemma_variant", "action_expert_variant"):
        if config[key] not in GEMMA_VARIANTS:
            raise RiptError(f"{folder / 'config.json'}: {key}={config[key]!r}; known: {', '.join(GEMMA_VARIANTS)}")
    return {"base_checkpoint": str(folder), "dtype": str(policy_cfg.dtype)}


@MODELS.register("pi0")
def pi0(base_checkpoint: str, dtype: str = "bf16", device: str = "cpu") -> Pi0Model:
    """openpi's folder as a ``Pi0Model``, built directly on ``device`` (CPUs run fp32)."""
    t0 = time.perf_counter()
    folder = Path(base_checkpoint)
    config = read_config(folder)
    vision = config.get("vision_variant", "so400m")  # openpi's π0 has one vision tower; tiny test folders name theirs
    with torch.device(device):
        model = Pi0Model(config["paligemma_variant"], config["action_expert_variant"], vision,
                         int(config["action_dim"]), int(config["action_horizon"]),
                         int(config.get("vocab_size", VOCAB)))
    with torch.no_grad():
        load_weights(model, folder)
    model.to(torch.float32 if str(device) == "cpu" else DTYPES[dtype])
    log.info("pi0: loaded %s in %.1f s", folder, time.perf_counter() - t0)
    return model.eval()
