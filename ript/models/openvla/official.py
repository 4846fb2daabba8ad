"""Official ``openvla/openvla-7b`` folders: ``config.json`` (with ``norm_stats`` and ``n_action_bins``), sharded
safetensors with the same tower, projector and Llama keys as OpenVLA-OFT plus ``language_model.lm_head.weight``,
and the tokenizer. No OFT head files: the LM head decodes the actions."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ript.errors import RiptError
from ript.models.openvla.model import OpenVLA
from ript.models.openvla_oft.config import OFTConfig
from ript.models.openvla_oft.official import dataset_statistics, fill_from_files, key_map, require_all_filled


def load_official_openvla(folder: str | Path, device: str | torch.device = "cpu",
                          dtype: torch.dtype = torch.float32) -> tuple[OpenVLA, dict]:
    """Build with empty weights, then fill every parameter from the folder. Returns (model, report)."""
    from accelerate import init_empty_weights

    t0 = time.perf_counter()
    folder = Path(folder)
    cfg = OFTConfig.from_folder(folder, chunk_size=1, num_images=1)
    cfg.proprio_dim = None  # one third-person image, no proprio token
    if "n_action_bins" not in cfg.raw:
        raise RiptError(f"{folder / 'config.json'}: no 'n_action_bins' (not an OpenVLA checkpoint)")
    with init_empty_weights(include_buffers=False):
        model = OpenVLA(cfg)
    targets = {**key_map(model), "language_model.lm_head.weight": [("lm_head.weight", lambda t: t)]}
    filled, unused = fill_from_files(model, folder, targets, cfg, device, dtype, "an OpenVLA")
    require_all_filled(model, filled, folder)
    model.to(device)
    return model.eval(), {"seconds": time.perf_counter() - t0, "unused_keys": unused,
                          "statistics": dataset_statistics(folder), "config": cfg}
