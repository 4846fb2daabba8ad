"""openpi's PyTorch checkpoint folder for π0: ``model.safetensors`` (openpi's ``PI0Pytorch`` state dict),
``config.json`` (``action_dim``, ``action_horizon``, ``paligemma_variant``, ``action_expert_variant``) and
``assets/<asset id>/norm_stats.json`` (``{"norm_stats": {"state": {"mean", "std", ...}, "actions": {...}}}``).
Every problem with a folder is one line naming the file and key."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from ript.errors import RiptError

CONFIG_KEYS = ("action_dim", "action_horizon", "paligemma_variant", "action_expert_variant")
PREFIX = "paligemma_with_expert."
# openpi's names -> this model's (ript.models.pi0.model.Pi0Model); the vision tower's inner names are transformers'
RENAMES = (
    (PREFIX + "paligemma.model.vision_tower.vision_model.", "vision."),
    (PREFIX + "paligemma.model.multi_modal_projector.linear.", "projector."),
    (PREFIX + "paligemma.model.language_model.norm.", "prefix_norm."),
    (PREFIX + "paligemma.model.language_model.layers.", "prefix_layers."),
    (PREFIX + "paligemma.lm_head.weight", "embed_tokens.weight"),  # tied to embed_tokens, saved under this name
    (PREFIX + "paligemma.model.language_model.embed_tokens.weight", "embed_tokens.weight"),
    (PREFIX + "gemma_expert.model.norm.", "expert_norm."),
    (PREFIX + "gemma_expert.model.layers.", "expert_layers."),
)
UNUSED = (PREFIX + "gemma_expert.lm_head.weight",)  # saved by openpi, never read (the expert has no vocabulary)


def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not (folder / "model.safetensors").is_file():
        raise RiptError(f"{folder}: no model.safetensors; not an openpi PyTorch π0 checkpoint folder")
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise RiptError(f"{path}: cannot read it ({e})") from None
    missing = [k for k in CONFIG_KEYS if k not in config]
    if missing:
        raise RiptError(f"{path}: no {missing[0]!r}; an openpi π0 config.json names {', '.join(CONFIG_KEYS)}")
    return config


def norm_stats(folder: Path, asset_id: str | None) -> dict[str, dict[str, torch.Tensor]]:
    """{"state": {"mean", "std"}, "actions": {...}} from ``assets/<asset id>/norm_stats.json`` (the only one, or
    ``asset_id``'s)."""
    found = sorted((folder / "assets").glob("**/norm_stats.json"))
    if asset_id is not None:
        found = [p for p in found if p.parent == folder / "assets" / asset_id]
    if len(found) != 1:
        where = folder / "assets" / (asset_id or "<asset id>") / "norm_stats.json"
        detail = "missing" if not found else f"{len(found)} found; pick one with policy.asset_id"
        raise RiptError(f"{where}: {detail} (π0's state and action statistics)")
    path = found[0]
    try:
        stats = json.loads(path.read_text())["norm_stats"]
        out = {part: {k: torch.tensor(stats[part][k], dtype=torch.float32) for k in ("mean", "std")}
               for part in ("state", "actions")}
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise RiptError(f"{path}: not openpi's norm_stats layout ({type(e).__name__}: {e}); expected "
                        f"norm_stats.state/actions.mean/std") from None
    for part, entry in out.items():
        if entry["mean"].shape != entry["std"].shape or not bool(torch.isfinite(entry["mean"]).all()):
            raise RiptError(f"{path}: norm_stats.{part}: mean and std differ in length or are not finite")
    return out


def renamed(key: str) -> str | None:
    """This model's name for an openpi key (None: a key it does not read)."""
    if key in UNUSED:
        return None
    for old, new in RENAMES:
        if key.startswith(old):
            return new + key[len(old):]
    return key  # the top-level projections keep their names


def load_weights(model, folder: Path) -> None:
    """openpi's ``model.safetensors`` into ``model``: every weight it needs present with its shape (the noise head,
    RL's own, keeps its initial values)."""
    path = folder / "model.safetensors"
    own = model.state_dict()
    vision_inner = next((k.split("vision.", 1)[1].split("embeddings")[0] for k in own if k.startswith("vision.")), "")
    loaded: set[str] = set()
    try:
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                name = renamed(key)
                if name is None:
                    continue
                if name.startswith("vision."):
                    name = "vision." + vision_inner + name[len("vision."):]
                if name not in own:
                    raise RiptError(f"{path}: key {key!r} does not fit this π0 model (its config.json's variants?)")
                tensor = f.get_tensor(key)
                if tensor.shape != own[name].shape:
                    raise RiptError(f"{path}: key {key!r} has shape {tuple(tensor.shape)}, the model expects "
                                    f"{tuple(own[name].shape)} (config.json's variants or action_dim?)")
                own[name].copy_(tensor)
                loaded.add(name)
    except (OSError, RuntimeError) as e:
        if isinstance(e, RiptError):
            raise
        raise RiptError(f"{path}: cannot read it ({e})") from None
    missing = sorted(k for k in own if k not in loaded and not k.startswith(("noise_head.", "rotary.")))
    if missing:
        raise RiptError(f"{path}: no weight for {missing[0]!r} ({len(missing)} missing); a partial or other checkpoint")
