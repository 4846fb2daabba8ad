"""OpenVLA-OFT in the model registry. Its weights live in the official checkpoint folder, so a ript
checkpoint of it (RL) records the folder and its build settings as ``model_kwargs`` and keeps only what RL
trained, as a peft adapter folder (``weights_format: adapter``); ``load_model`` rebuilds it from both."""

from __future__ import annotations

from pathlib import Path

import torch

from ript.errors import RiptError
from ript.registry import MODELS
from ript.utils.logging import log

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}


def model_family(folder: str | Path) -> str:
    """``openvla_oft`` for a folder with OFT's action head file, else ``openvla``: the original (discrete-token)
    OpenVLA, whose LM head decodes the bins (both configs name ``n_action_bins``; the OpenVLA loader refuses a
    folder that is neither, naming what is missing)."""
    return "openvla_oft" if any(Path(folder).glob("action_head--*checkpoint.pt")) else "openvla"


def model_kwargs(checkpoint: str | None, policy_cfg) -> tuple[str, dict]:
    """(model name, what it needs to rebuild the model of an official folder with a ``policy`` config's keys)."""
    if not checkpoint:
        raise RiptError("checkpoint=<official OpenVLA-OFT or OpenVLA folder> is required")
    if str(policy_cfg.dtype) not in DTYPES:
        raise RiptError(f"policy.dtype must be one of {', '.join(DTYPES)}, not {policy_cfg.dtype!r}")
    folder = Path(checkpoint).resolve()
    if model_family(folder) == "openvla":
        return "openvla", {"base_checkpoint": str(folder), "dtype": str(policy_cfg.dtype)}
    return "openvla_oft", {"base_checkpoint": str(folder), "dtype": str(policy_cfg.dtype),
                           "chunk_size": int(policy_cfg.chunk_size), "attention": str(policy_cfg.attention),
                           "num_images": len(policy_cfg.image_keys)}


@MODELS.register("openvla_oft")
def openvla_oft(base_checkpoint: str, dtype: str, chunk_size: int, attention: str, num_images: int,
                device: str = "cpu") -> torch.nn.Module:
    """The official folder's model, built directly on ``device`` (7B: never a CPU copy first); CPUs run fp32."""
    from ript.models.openvla_oft.official import load_official

    torch_dtype = torch.float32 if str(device) == "cpu" else DTYPES[dtype]
    model, report = load_official(base_checkpoint, device=device, dtype=torch_dtype, chunk_size=chunk_size,
                                  attention=attention, num_images=num_images)
    log.info("oft: loaded %s in %.1f s (%d official keys unused by design)", base_checkpoint, report["seconds"],
             report["unused_keys"])
    return model
