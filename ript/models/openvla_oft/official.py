"""Official OpenVLA-OFT checkpoint folders: read them into ``OpenVLAOFT``, and write them (for tests and
for full-size benchmarks with random weights).

A folder holds ``config.json``, ``model.safetensors`` or sharded ``model-0000i-of-0000n.safetensors`` with
``model.safetensors.index.json``, ``dataset_statistics.json``, the tokenizer, and OFT's
``action_head--<step>_checkpoint.pt`` / ``proprio_projector--<step>_checkpoint.pt`` (saved from DDP, so
their keys may start with ``module.``). Vision weights are timm's (fused ``qkv``, LayerScale renamed to
``scale_factor`` by OpenVLA); they map onto the transformers towers here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import torch

from ript.errors import RiptError
from ript.models.openvla_oft.config import OFTConfig
from ript.models.openvla_oft.model import OpenVLAOFT

TOWER_PREFIX = {"featurizer": "vision_backbone.featurizer.", "fused_featurizer": "vision_backbone.fused_featurizer."}
Target = tuple[str, Callable[[torch.Tensor], torch.Tensor]]


def _first_present(model: torch.nn.Module, base: str, candidates: tuple[str, ...]) -> str:
    """transformers renamed attention modules across versions; use whichever this one has."""
    for c in candidates:
        try:
            model.get_submodule(f"{base}.{c}")
            return f"{base}.{c}"
        except AttributeError:
            continue
    raise RuntimeError(f"none of {candidates} under {base}")


def _rows(i: int, n: int) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda t: t.chunk(n, dim=0)[i]


def key_map(model: OpenVLAOFT) -> dict[str, list[Target]]:
    """Official key -> [(our parameter, transform of the official tensor)]."""
    same = lambda t: t  # noqa: E731
    out: dict[str, list[Target]] = {}
    for tower_name, prefix in TOWER_PREFIX.items():
        tower = getattr(model, tower_name)
        dino = tower.prefix > 0
        emb = f"{tower_name}.embeddings"
        if dino:
            out[prefix + "cls_token"] = [(f"{emb}.cls_token", same)]
            out[prefix + "reg_token"] = [(f"{emb}.register_tokens", same)]
            # timm gives the class token no position (no_embed_class); transformers adds position 0 to it
            out[prefix + "pos_embed"] = [(f"{emb}.position_embeddings",
                                          lambda t: torch.cat([torch.zeros_like(t[:, :1]), t], 1))]
            patch = f"{emb}.patch_embeddings.projection"
        else:
            out[prefix + "pos_embed"] = [(f"{emb}.position_embedding.weight", lambda t: t[0])]
            patch = f"{emb}.patch_embedding"
        for p in ("weight", "bias"):
            out[f"{prefix}patch_embed.proj.{p}"] = [(f"{patch}.{p}", same)]
        for i in range(len(tower.layers)):
            layer = f"{tower_name}.layers.{i}"
            attn = "attention" if dino else "self_attn"
            q = _first_present(model, layer, (f"{attn}.q_proj", f"{attn}.attention.query"))
            k = _first_present(model, layer, (f"{attn}.k_proj", f"{attn}.attention.key"))
            v = _first_present(model, layer, (f"{attn}.v_proj", f"{attn}.attention.value"))
            o = _first_present(model, layer, (f"{attn}.o_proj", f"{attn}.out_proj", f"{attn}.output.dense"))
            n1, n2 = ("norm1", "norm2") if dino else ("layer_norm1", "layer_norm2")
            src = f"{prefix}blocks.{i}."
            for p in ("weight", "bias"):
                out[f"{src}attn.qkv.{p}"] = [(f"{q}.{p}", _rows(0, 3)), (f"{k}.{p}", _rows(1, 3)),
                                             (f"{v}.{p}", _rows(2, 3))]
                out[f"{src}attn.proj.{p}"] = [(f"{o}.{p}", same)]
                out[f"{src}norm1.{p}"] = [(f"{layer}.{n1}.{p}", same)]
                out[f"{src}norm2.{p}"] = [(f"{layer}.{n2}.{p}", same)]
                out[f"{src}mlp.fc1.{p}"] = [(f"{layer}.mlp.fc1.{p}", same)]
                out[f"{src}mlp.fc2.{p}"] = [(f"{layer}.mlp.fc2.{p}", same)]
            if dino:
                out[f"{src}ls1.scale_factor"] = [(f"{layer}.layer_scale1.lambda1", same)]
                out[f"{src}ls2.scale_factor"] = [(f"{layer}.layer_scale2.lambda1", same)]
    for name, _ in model.projector.named_parameters():
        out[f"projector.{name}"] = [(f"projector.{name}", same)]
    for name, _ in model.language_model.named_parameters():
        out[f"language_model.model.{name}"] = [(f"language_model.{name}", same)]
    return out


def unused_by_design(key: str, cfg: OFTConfig) -> bool:
    """Official keys this model leaves out on purpose: each tower's last block and final norm (OpenVLA reads
    the second-to-last block), SigLIP's attention-pool head, and the LM head (OFT regresses actions)."""
    for (_name, prefix), spec in zip(TOWER_PREFIX.items(), cfg.towers):
        if key.startswith(prefix):
            rest = key[len(prefix):]
            return rest.startswith((f"blocks.{spec.depth - 1}.", "norm.", "attn_pool.", "head."))
    return key == "language_model.lm_head.weight"


def _aliases(key: str) -> str:
    return key.replace(".ls1.gamma", ".ls1.scale_factor").replace(".ls2.gamma", ".ls2.scale_factor")


def _component(folder: Path, stem: str) -> Path | None:
    found = sorted(folder.glob(f"{stem}--*checkpoint.pt"))
    if len(found) > 1:
        raise RiptError(f"{folder}: several {stem}--*checkpoint.pt files "
                        f"({', '.join(p.name for p in found)}); keep one")
    return found[0] if found else None


def _read_component(file: Path, device) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(file, map_location=device, weights_only=True)
    except Exception as e:  # torch raises several types for truncated or foreign files
        raise RiptError(f"{file}: not a readable torch state dict ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict):
        raise RiptError(f"{file}: holds a {type(state).__name__}, not a state dict")
    return {k.removeprefix("module."): v for k, v in state.items()}  # saved from DDP-wrapped modules


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError) as e:
            raise RiptError(f"{index}: not a safetensors index (missing or bad key 'weight_map': {e})") from None
        files = [folder / n for n in names]
    else:
        files = [folder / "model.safetensors"]
    for f in files:
        if not f.is_file():
            raise RiptError(f"{f}: no such file (named by {folder.name}'s checkpoint)")
    return files


def _set_param(model: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    module_name, _, attr = name.rpartition(".")
    module = model.get_submodule(module_name)
    old = module._parameters[attr]
    module._parameters[attr] = torch.nn.Parameter(value, requires_grad=old.requires_grad)


def load_official(folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                  **cfg_overrides) -> tuple[OpenVLAOFT, dict]:
    """Build the model with empty weights, then fill every parameter from the folder's files. Returns
    (model, report) with load time, unused-by-design key count and the dataset statistics."""
    import time

    from accelerate import init_empty_weights

    t0 = time.perf_counter()
    folder = Path(folder)
    cfg = OFTConfig.from_folder(folder, **cfg_overrides)
    head_file, proprio_file = _component(folder, "action_head"), _component(folder, "proprio_projector")
    if head_file is None:
        raise RiptError(f"{folder}: no action_head--*checkpoint.pt (OFT's L1-regression head)")
    extras = {stem: _read_component(f, device)
              for stem, f in (("action_head.", head_file), ("proprio_projector.", proprio_file))
              if f is not None}
    head = extras["action_head."]
    # the chunk's action and proprio sizes are OFT code constants per platform; the files tell them
    if "model.fc2.weight" in head:
        cfg.action_dim, cfg.head_hidden_dim = head["model.fc2.weight"].shape[0], head["model.fc2.weight"].shape[1]
    cfg.proprio_dim = extras["proprio_projector."]["fc1.weight"].shape[1] if proprio_file is not None else None
    with init_empty_weights(include_buffers=False):
        model = OpenVLAOFT(cfg)
    own = dict(model.named_parameters())
    filled, unused = fill_from_files(model, folder, key_map(model), cfg, device, dtype, "an OpenVLA-OFT")
    for prefix, state in extras.items():
        file = head_file if prefix == "action_head." else proprio_file
        for key, tensor in state.items():
            name = prefix + key
            if name not in own:
                raise RiptError(f"{file}: unexpected key {key!r}")
            if tuple(tensor.shape) != tuple(own[name].shape):
                raise RiptError(f"{file}: key {key!r} has shape {tuple(tensor.shape)}, model expects "
                                f"{tuple(own[name].shape)} (config.json's LLM width, or policy.chunk_size?)")
            _set_param(model, name, tensor.to(device=device, dtype=dtype).contiguous())
            filled.add(name)
    require_all_filled(model, filled, folder)
    model.to(device)  # the buffers (normalisation constants, rotary frequencies)
    stats = dataset_statistics(folder)
    return model.eval(), {"seconds": time.perf_counter() - t0, "unused_keys": unused, "statistics": stats,
                          "config": cfg}


def fill_from_files(model: torch.nn.Module, folder: Path, targets: dict[str, list[Target]], cfg: OFTConfig, device,
                    dtype: torch.dtype, kind: str) -> tuple[set[str], int]:
    """Fill the parameters ``targets`` maps the folder's safetensors keys to; returns (filled names, count of
    official keys left out by design). A key neither mapped nor left out by design is refused."""
    from safetensors import SafetensorError, safe_open

    own = dict(model.named_parameters())
    filled: set[str] = set()
    unused = 0
    for f in _weight_files(folder):
        try:
            with safe_open(str(f), framework="pt", device=str(device)) as st:
                for key in st.keys():
                    official = _aliases(key)
                    if official not in targets:
                        if unused_by_design(official, cfg):
                            unused += 1
                            continue
                        raise RiptError(f"{f}: unexpected key {official!r} (not part of {kind} checkpoint)")
                    tensor = st.get_tensor(key)
                    for name, fn in targets[official]:
                        value = fn(tensor)
                        if tuple(value.shape) != tuple(own[name].shape):
                            raise RiptError(f"{f}: key {official!r} has shape {tuple(tensor.shape)}, which does not "
                                            f"fit {name} {tuple(own[name].shape)} of the model config.json describes")
                        _set_param(model, name, value.to(device=device, dtype=dtype).contiguous())
                        filled.add(name)
        except SafetensorError as e:
            raise RiptError(f"{f}: not a readable safetensors file ({e})") from None
    return filled, unused


def require_all_filled(model: torch.nn.Module, filled: set[str], folder: Path) -> None:
    missing = sorted(set(dict(model.named_parameters())) - filled)
    if missing:
        raise RiptError(f"{folder}: checkpoint lacks {len(missing)} weights of the model, e.g. {missing[0]!r}")


def dataset_statistics(folder: Path) -> dict:
    path = folder / "dataset_statistics.json"
    if path.is_file():
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise RiptError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    stats = json.loads((folder / "config.json").read_text()).get("norm_stats")
    if not stats:
        raise RiptError(f"{folder}: no dataset_statistics.json and no 'norm_stats' in config.json (needed to "
                        "un-normalise actions)")
    return stats


def _flat(values: list) -> list:
    return [y for x in values for y in (_flat(x) if isinstance(x, list) else [x])]


def pick_statistics(stats: dict, suite: str, key: str | None, where: str) -> dict:
    """OFT's rule: the suite's name, else '<suite>_no_noops'; or the key the user names."""
    for k in ([key] if key else [suite, f"{suite}_no_noops"]):
        if k in stats:
            entry = stats[k]
            if "q01" not in entry.get("action", {}) or "q99" not in entry.get("action", {}):
                raise RiptError(f"{where}: statistics {k!r} lack action.q01/q99")
            for group, values in entry.items():
                for name, v in (values.items() if isinstance(values, dict) else []):
                    if isinstance(v, list) and not all(isinstance(x, (int, float)) and math.isfinite(x)
                                                       for x in _flat(v)):
                        raise RiptError(f"{where}: statistics {k!r} {group}.{name} hold NaN, inf or non-numbers")
            return entry
    raise RiptError(f"{where}: no statistics for {key or suite!r}; available: {', '.join(stats)} "
                    "(set policy.unnorm_key)")
