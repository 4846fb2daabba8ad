"""Shape of an OpenVLA-OFT model, read from an official checkpoint folder's ``config.json``.

The official config names its vision towers by timm id and leaves the Llama-2 sizes to ``LlamaConfig``'s
defaults; the towers' sizes come from the table below. Small test checkpoints written in the official
layout add ``ript_vision_overrides`` (per timm id) and a full ``text_config``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ript.errors import RiptError


@dataclass(frozen=True)
class TowerSpec:
    """One ViT tower as timm builds it for OpenVLA (its features are those of the second-to-last block)."""

    embed_dim: int
    depth: int
    num_heads: int
    mlp_dim: int
    patch_size: int = 14
    register_tokens: int = 0
    class_token: bool = True
    layer_scale: bool = False
    # image normalisation the tower was trained with
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)


IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
TOWERS: dict[str, TowerSpec] = {
    "vit_large_patch14_reg4_dinov2.lvd142m": TowerSpec(1024, 24, 16, 4096, register_tokens=4, layer_scale=True,
                                                       mean=IMAGENET_MEAN, std=IMAGENET_STD),
    "vit_so400m_patch14_siglip_224": TowerSpec(1152, 27, 16, 4304, class_token=False),
}

# OFT's LIBERO constants (prismatic/vla/constants.py): 8-step chunks of 7-D actions, 8-D proprio
DEFAULT_CHUNK, DEFAULT_ACTION_DIM, DEFAULT_PROPRIO_DIM = 8, 7, 8


@dataclass
class OFTConfig:
    towers: tuple[TowerSpec, ...]
    image_size: int
    text_config: dict[str, Any]
    num_images: int = 2
    chunk_size: int = DEFAULT_CHUNK
    action_dim: int = DEFAULT_ACTION_DIM
    proprio_dim: int | None = DEFAULT_PROPRIO_DIM  # None: no proprio token
    head_hidden_dim: int | None = None  # None: the LLM width, as OFT
    head_blocks: int = 2
    # "bidirectional": every token sees every token, as OFT's transformers fork runs (and its checkpoints were
    # trained); "prefix_causal": causal prompt, bidirectional action block, which allows a prompt KV cache
    attention: str = "bidirectional"
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def vision_dim(self) -> int:
        return sum(t.embed_dim for t in self.towers)

    @property
    def llm_dim(self) -> int:
        return int(self.text_config.get("hidden_size", 4096))

    @property
    def patches_per_image(self) -> int:
        return (self.image_size // self.towers[0].patch_size) ** 2

    @classmethod
    def from_dict(cls, cfg: dict[str, Any], where: str = "config.json", **overrides: Any) -> OFTConfig:
        if not cfg.get("use_fused_vision_backbone", False):
            raise RiptError(f"{where}: use_fused_vision_backbone is not true; OpenVLA-OFT uses DINOv2 + SigLIP")
        ids = cfg.get("timm_model_ids")
        if not isinstance(ids, list) or len(ids) != 2:
            raise RiptError(f"{where}: key 'timm_model_ids' must list the two fused vision towers")
        extra = cfg.get("ript_vision_overrides", {})
        towers = []
        for tid in ids:
            if tid not in TOWERS:
                raise RiptError(f"{where}: unknown vision tower {tid!r} in 'timm_model_ids'; "
                                f"known: {', '.join(TOWERS)}")
            spec = TOWERS[tid]
            if tid in extra:
                spec = TowerSpec(**{**spec.__dict__, **extra[tid]})
            towers.append(spec)
        sizes = cfg.get("image_sizes", [224, 224])
        if len(set(sizes)) != 1 or towers[0].patch_size != towers[1].patch_size:
            raise RiptError(f"{where}: the two towers must share image size and patch size (key 'image_sizes')")
        text = dict(cfg.get("text_config", {}))
        if text.get("model_type", "llama") != "llama":
            raise RiptError(f"{where}: text_config.model_type {text.get('model_type')!r} is not 'llama'")
        fields = {k: v for k, v in overrides.items() if v is not None}
        return cls(towers=tuple(towers), image_size=int(sizes[0]), text_config=text, raw=cfg, **fields)

    @classmethod
    def from_folder(cls, folder: str | Path, **overrides: Any) -> OFTConfig:
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise RiptError(f"{path}: no such file (an OpenVLA-OFT checkpoint folder has a config.json)")
        try:
            cfg = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise RiptError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        return cls.from_dict(cfg, str(path), **overrides)

    def llama_config(self):
        from transformers import LlamaConfig

        text = {k: v for k, v in self.text_config.items() if k not in ("model_type", "torch_dtype")}
        return LlamaConfig(**text)
