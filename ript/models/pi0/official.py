"""π0 checkpoint folders, in either of two layouts, read without openpi or lerobot installed:

- openpi's PyTorch folder: ``model.safetensors`` (``PI0Pytorch``'s state dict), ``config.json`` (``action_dim``,
  ``action_horizon``, ``paligemma_variant``, ``action_expert_variant``) and ``assets/<asset id>/norm_stats.json``
  (``{"norm_stats": {"state": {"mean", "std", ...}, "actions": {...}}}``);
- lerobot's ``pi0`` policy folder: ``config.json`` (``"type": "pi0"``, ``max_action_dim``, ``chunk_size``, the two
  variants), ``model.safetensors`` (openpi's names under ``model.``) and ``policy_preprocessor.json``, whose
  normalizer step names the safetensors file of the dataset's statistics (``observation.state.mean``, ``action.std``).

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
# the prefix's token embedding, saved as the lm_head tied to it, or under both names (lerobot from 0.5 unties them)
LM_HEAD, EMBED = "paligemma.lm_head.weight", "paligemma.model.language_model.embed_tokens.weight"


# lerobot's config.json keys for openpi's (the model's shape); the extra keys a tiny test folder names pass as they are
LEROBOT_KEYS = {"max_action_dim": "action_dim", "chunk_size": "action_horizon",
                "paligemma_variant": "paligemma_variant", "action_expert_variant": "action_expert_variant"}
LEROBOT_PREFIX = "model."


def raw_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not (folder / "model.safetensors").is_file():
        raise RiptError(f"{folder}: no model.safetensors; not a π0 checkpoint folder (openpi's or lerobot's)")
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise RiptError(f"{path}: cannot read it ({e})") from None


def is_lerobot(folder: Path) -> bool:
    """lerobot's policy folders name their policy type in config.json; openpi's do not."""
    return "type" in raw_config(folder)


def read_config(folder: Path) -> dict:
    """The model's shape from either layout's config.json, under openpi's keys."""
    path, config = folder / "config.json", raw_config(folder)
    if "type" in config:
        if config["type"] != "pi0":
            raise RiptError(f"{path}: type={config['type']!r}; only lerobot's \"pi0\" policy is read (π0.5's "
                            f"adaptive norms and quantile statistics are another model)")
        missing = [k for k in LEROBOT_KEYS if k not in config]
        if missing:
            raise RiptError(f"{path}: no {missing[0]!r}; a lerobot pi0 config.json names {', '.join(LEROBOT_KEYS)}")
        return {**{k: v for k, v in config.items() if k not in LEROBOT_KEYS},
                **{ours: config[theirs] for theirs, ours in LEROBOT_KEYS.items()}}
    missing = [k for k in CONFIG_KEYS if k not in config]
    if missing:
        raise RiptError(f"{path}: no {missing[0]!r}; an openpi π0 config.json names {', '.join(CONFIG_KEYS)}")
    return config


def norm_stats(folder: Path, asset_id: str | None) -> dict[str, dict[str, torch.Tensor]]:
    """{"state": {"mean", "std"}, "actions": {...}}: openpi's ``assets/<asset id>/norm_stats.json`` (the only one,
    or ``asset_id``'s), or lerobot's normalizer statistics."""
    if is_lerobot(folder):
        return lerobot_norm_stats(folder)
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
    return checked_stats(out, path)


def checked_stats(out: dict, path: Path) -> dict:
    for part, entry in out.items():
        if entry["mean"].shape != entry["std"].shape or not bool(torch.isfinite(entry["mean"]).all()):
            raise RiptError(f"{path}: {part}: mean and std differ in length or are not finite")
    return out


def lerobot_norm_stats(folder: Path) -> dict[str, dict[str, torch.Tensor]]:
    """The state's and the actions' mean and std from the file the normalizer step of ``policy_preprocessor.json``
    names; π0 normalizes both by mean and std (lerobot's ``MEAN_STD``)."""
    pipeline = folder / "policy_preprocessor.json"
    try:
        steps = json.loads(pipeline.read_text())["steps"]
        step = next(s for s in steps if s.get("registry_name") == "normalizer_processor")
        norm_map, state_file = step["config"].get("norm_map", {}), step["state_file"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError, StopIteration) as e:
        raise RiptError(f"{pipeline}: no normalizer step with a state_file ({type(e).__name__}); a lerobot pi0 "
                        f"folder saves its preprocessor there") from None
    for kind in ("STATE", "ACTION"):
        if norm_map.get(kind, "MEAN_STD") != "MEAN_STD":
            raise RiptError(f"{pipeline}: norm_map.{kind}={norm_map[kind]!r}; π0 reads MEAN_STD statistics")
    path = folder / state_file
    try:
        with safe_open(str(path), framework="pt") as f:
            out = {part: {stat: f.get_tensor(f"{feature}.{stat}").float().flatten() for stat in ("mean", "std")}
                   for part, feature in (("state", "observation.state"), ("actions", "action"))}
    except (OSError, RuntimeError, KeyError) as e:
        raise RiptError(f"{path}: cannot read observation.state/action mean and std ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''})") from None
    return checked_stats(out, path)


def renamed(key: str, lerobot: bool = False) -> str | None:
    """This model's name for an openpi key, or a lerobot one (openpi's under ``model.``); None: a key it does not
    read."""
    if lerobot:
        if not key.startswith(LEROBOT_PREFIX):
            raise RiptError(f"key {key!r} is not under {LEROBOT_PREFIX!r}; not lerobot's pi0 state dict")
        key = key[len(LEROBOT_PREFIX):]
    if key in UNUSED:
        return None
    for old, new in RENAMES:
        if key.startswith(old):
            return new + key[len(old):]
    return key  # the top-level projections keep their names


def load_weights(model, folder: Path) -> None:
    """The folder's ``model.safetensors`` (openpi's names, or lerobot's under ``model.``) into ``model``: every
    weight it needs present with its shape (the noise head, RL's own, keeps its initial values)."""
    path, lerobot = folder / "model.safetensors", is_lerobot(folder)
    own = model.state_dict()
    vision_inner = next((k.split("vision.", 1)[1].split("embeddings")[0] for k in own if k.startswith("vision.")), "")
    loaded: set[str] = set()
    try:
        with safe_open(str(path), framework="pt") as f:
            keys = list(f.keys())
            for key in keys:
                try:
                    name = renamed(key, lerobot)
                except RiptError as e:
                    raise RiptError(f"{path}: {e}") from None
                if name is None or (key.endswith(LM_HEAD) and key.replace(LM_HEAD, EMBED) in keys):
                    continue  # the embedding itself where both are saved (lerobot from 0.5 unties them)
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
