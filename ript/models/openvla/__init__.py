"""The original (discrete-token) OpenVLA, read from an official ``openvla/openvla-7b`` folder, in the model
registry: a ript checkpoint of it (RL) records the folder and keeps a peft adapter, like OpenVLA-OFT's."""

from __future__ import annotations

import torch

from ript.models.openvla_oft import DTYPES
from ript.registry import MODELS
from ript.utils.logging import log


@MODELS.register("openvla")
def openvla(base_checkpoint: str, dtype: str, device: str = "cpu") -> torch.nn.Module:
    """The official folder's model, built directly on ``device``; CPUs run fp32."""
    from ript.models.openvla.official import load_official_openvla

    torch_dtype = torch.float32 if str(device) == "cpu" else DTYPES[dtype]
    model, report = load_official_openvla(base_checkpoint, device=device, dtype=torch_dtype)
    log.info("openvla: loaded %s in %.1f s (%d official keys unused by design)", base_checkpoint, report["seconds"],
             report["unused_keys"])
    return model
