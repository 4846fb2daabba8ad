"""OpenVLA-OFT from transformers-native parts: DINOv2 + SigLIP towers, the fused-GELU MLP projector,
a Llama-2 decoder, OFT's proprio token, parallel decoding of an action chunk and its L1-regression
MLP-ResNet head; plus a Laplace scale head for RL.

Sequence layout (one row per env; pads sit inside the prompt and are masked out, positions skip them):

    [BOS] [image patches x num_images] [proprio] [pad.. prompt..] [empty "▁"] [chunk*action_dim zeros] [EOS]

The action positions carry zero embeddings; the final-norm hidden states there feed the heads.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ript.models.openvla_oft.config import OFTConfig, TowerSpec


def _layer_out(out):
    return out[0] if isinstance(out, tuple) else out


class VisionTower(nn.Module):
    """A ViT tower truncated after its second-to-last block, whose patch features (no final norm, no
    class/register tokens) OpenVLA reads."""

    def __init__(self, spec: TowerSpec, image_size: int):
        super().__init__()
        self.spec = spec
        common = dict(hidden_size=spec.embed_dim, num_hidden_layers=spec.depth - 1, num_attention_heads=spec.num_heads,
                      image_size=image_size, patch_size=spec.patch_size, hidden_act="gelu", layer_norm_eps=1e-6)
        if spec.layer_scale:  # DINOv2 (with registers)
            from transformers import Dinov2WithRegistersConfig, Dinov2WithRegistersModel

            cfg = Dinov2WithRegistersConfig(**common, mlp_ratio=spec.mlp_dim // spec.embed_dim,
                                            num_register_tokens=spec.register_tokens, qkv_bias=True)
            net = Dinov2WithRegistersModel(cfg)
            if spec.mlp_dim % spec.embed_dim:
                raise ValueError(f"DINOv2 tower: mlp_dim {spec.mlp_dim} must be a multiple of "
                                 f"embed_dim {spec.embed_dim}")
            del net.embeddings.mask_token  # masked-image pretraining only
            net.layernorm = nn.Identity()
            self.embeddings, self.layers = net.embeddings, net.encoder.layer
            self.prefix = 1 + spec.register_tokens
        else:  # SigLIP
            from transformers import SiglipVisionConfig, SiglipVisionModel

            cfg = SiglipVisionConfig(**common, intermediate_size=spec.mlp_dim, vision_use_head=False)
            net = SiglipVisionModel(cfg)
            net = getattr(net, "vision_model", net)  # transformers < 5 wraps the transformer once more
            self.embeddings, self.layers = net.embeddings, net.encoder.layers
            self.prefix = 0
        self.register_buffer("mean", torch.tensor(spec.mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(spec.std).view(1, 3, 1, 1), persistent=False)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels in [0, 1], (N, 3, H, W) -> (N, patches, embed_dim)."""
        x = ((pixels - self.mean) / self.std).to(next(self.embeddings.parameters()).dtype)
        h = self.embeddings(x)
        for layer in self.layers:
            h = _layer_out(layer(h, None)) if self.prefix == 0 else _layer_out(layer(h))
        return h[:, self.prefix:]


class Projector(nn.Module):
    """OpenVLA's fused-backbone projector: vision -> 4x vision -> LLM -> LLM, GELU between."""

    def __init__(self, vision_dim: int, llm_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(vision_dim, 4 * vision_dim)
        self.fc2 = nn.Linear(4 * vision_dim, llm_dim)
        self.fc3 = nn.Linear(llm_dim, llm_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.gelu(self.fc2(F.gelu(self.fc1(x)))))


class ProprioProjector(nn.Module):
    def __init__(self, proprio_dim: int, llm_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(proprio_dim, llm_dim)
        self.fc2 = nn.Linear(llm_dim, llm_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class ResidualBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.ffn = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ffn(x)


class MLPResNet(nn.Module):
    def __init__(self, blocks: int, in_dim: int, hidden: int, out_dim: int):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(in_dim)
        self.fc1 = nn.Linear(in_dim, hidden)
        self.mlp_resnet_blocks = nn.ModuleList(ResidualBlock(hidden) for _ in range(blocks))
        self.layer_norm2 = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc1(self.layer_norm1(x)))
        for block in self.mlp_resnet_blocks:
            x = block(x)
        return self.fc2(self.layer_norm2(x))


class ActionHead(nn.Module):
    """OFT's L1-regression head: each chunk step reads its action_dim tokens' hidden states, concatenated."""

    def __init__(self, llm_dim: int, action_dim: int, hidden: int, blocks: int = 2):
        super().__init__()
        self.action_dim = action_dim
        self.model = MLPResNet(blocks, llm_dim * action_dim, hidden, action_dim)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, chunk*action_dim, D) -> (B, chunk, action_dim), normalised actions."""
        return self.model(hidden.reshape(hidden.shape[0], -1, hidden.shape[-1] * self.action_dim))


class ScaleHead(ActionHead):
    """Laplace scales for RL, per chunk step and action dim; starts at ``init_scale`` everywhere."""

    def __init__(self, llm_dim: int, action_dim: int, hidden: int = 256, init_scale: float = 0.1,
                 min_scale: float = 1e-3):
        super().__init__(llm_dim, action_dim, hidden, blocks=1)
        self.min_scale = min_scale
        nn.init.zeros_(self.model.fc2.weight)
        nn.init.constant_(self.model.fc2.bias, float(torch.log(torch.expm1(torch.tensor(init_scale - min_scale)))))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.softplus(super().forward(hidden).float()) + self.min_scale


class PrismaticBackbone(nn.Module):
    """What OpenVLA and OpenVLA-OFT share: the fused DINOv2 + SigLIP towers, the projector, the Llama decoder
    (and OFT's proprio projector when the config has one)."""

    def __init__(self, cfg: OFTConfig):
        super().__init__()
        from transformers import LlamaModel

        self.cfg = cfg
        self.featurizer = VisionTower(cfg.towers[0], cfg.image_size)  # DINOv2: an image's first 3 channels
        self.fused_featurizer = VisionTower(cfg.towers[1], cfg.image_size)  # SigLIP
        self.projector = Projector(cfg.vision_dim, cfg.llm_dim)
        self.language_model = LlamaModel(cfg.llama_config())
        self.proprio_projector = ProprioProjector(cfg.proprio_dim, cfg.llm_dim) if cfg.proprio_dim else None
        self.scale_head: ScaleHead | None = None  # OFT's RL adds one; adapters save it when present

    def visual_tokens(self, images: torch.Tensor, proprio: torch.Tensor | None) -> torch.Tensor:
        """images uint8 (B, num_images, 3, S, S), proprio normalised (B, P) -> (B, patches [+1], D)."""
        b, n = images.shape[:2]
        pixels = images.flatten(0, 1).float() / 255.0
        feats = torch.cat([self.featurizer(pixels), self.fused_featurizer(pixels)], dim=-1)
        tokens = self.projector(feats).reshape(b, n * feats.shape[1], -1)  # image-major, as OFT concatenates
        if self.proprio_projector is not None:
            if proprio is None:
                raise ValueError("this checkpoint has a proprio projector: proprio input is required")
            tokens = torch.cat([tokens, self.proprio_projector(proprio.to(tokens.dtype)).unsqueeze(1)], dim=1)
        return tokens


class OpenVLAOFT(PrismaticBackbone):
    def __init__(self, cfg: OFTConfig):
        super().__init__(cfg)
        self.action_head = ActionHead(cfg.llm_dim, cfg.action_dim, cfg.head_hidden_dim or cfg.llm_dim, cfg.head_blocks)

    @property
    def action_tokens(self) -> int:
        return self.cfg.chunk_size * self.cfg.action_dim

    def add_scale_head(self, hidden: int = 256, init_scale: float = 0.1) -> ScaleHead:
        p = next(self.action_head.parameters())
        self.scale_head = ScaleHead(self.cfg.llm_dim, self.cfg.action_dim, hidden, init_scale).to(p.device)
        return self.scale_head

    def sequence(self, images, proprio, text_ids, text_valid):
        """Embeddings, validity and position ids of the whole sequence. ``text_ids`` (B, T) start with BOS and
        end with the action placeholders and EOS; the visual tokens go right after BOS."""
        emb = self.language_model.get_input_embeddings()(text_ids)
        is_action = torch.zeros_like(text_valid)
        is_action[:, -self.action_tokens - 1: -1] = True
        emb = emb * ~is_action.unsqueeze(-1)  # OFT: action positions carry only their position
        vis = self.visual_tokens(images, proprio).to(emb.dtype)
        embeds = torch.cat([emb[:, :1], vis, emb[:, 1:]], dim=1)
        ones = text_valid.new_ones(vis.shape[:2])
        valid = torch.cat([text_valid[:, :1], ones, text_valid[:, 1:]], dim=1)
        positions = (valid.long().cumsum(1) - 1).clamp(min=0)
        return embeds, valid, positions

    def attention_mask(self, valid: torch.Tensor, n_query: int, dtype, block: int) -> torch.Tensor:
        """Additive (B, 1, n_query, S) mask for the last ``n_query`` positions: pads are never seen; in
        ``prefix_causal`` mode the prompt is causal and the action block (+EOS, from ``block`` on) sees itself
        both ways."""
        s = valid.shape[1]
        allowed = valid[:, None, None, :].expand(-1, 1, n_query, s).clone()
        if self.cfg.attention == "prefix_causal":
            q = torch.arange(s - n_query, s, device=valid.device)[:, None]
            k = torch.arange(s, device=valid.device)[None, :]
            allowed &= ((k <= q) | ((q >= block) & (k >= block)))[None, None]
        elif self.cfg.attention != "bidirectional":
            raise ValueError(f"unknown attention mode {self.cfg.attention!r}")
        mask = torch.zeros(allowed.shape, dtype=dtype, device=valid.device)
        return mask.masked_fill(~allowed, torch.finfo(dtype).min)

    def action_hidden(self, images, proprio, text_ids, text_valid, prefix_cache: bool = False,
                      prefix_grad: bool = True) -> torch.Tensor:
        """Final-norm hidden states at the action positions, (B, chunk*action_dim, D).

        ``prefix_cache`` (prefix_causal mode only) runs the prompt once into a KV cache and the action block
        against it; ``prefix_grad=False`` also keeps that prefix out of the autograd graph (the values are
        the same; the gradient then flows only through the action block)."""
        embeds, valid, positions = self.sequence(images, proprio, text_ids, text_valid)
        lm, n_act = self.language_model, self.action_tokens + 1
        p = embeds.shape[1] - n_act  # where the action block starts
        if not prefix_cache:
            out = lm(inputs_embeds=embeds, attention_mask=self.attention_mask(valid, valid.shape[1], embeds.dtype, p),
                     position_ids=positions, use_cache=False)
            return out.last_hidden_state[:, -n_act:-1]
        if self.cfg.attention != "prefix_causal":
            raise ValueError("prefix_cache needs attention='prefix_causal' (the prompt must not see the actions)")
        from transformers import DynamicCache

        cache = DynamicCache()
        with torch.set_grad_enabled(prefix_grad and torch.is_grad_enabled()):
            lm(inputs_embeds=embeds[:, :p], attention_mask=self.attention_mask(valid[:, :p], p, embeds.dtype, p),
               position_ids=positions[:, :p], past_key_values=cache, use_cache=True)
        out = lm(inputs_embeds=embeds[:, p:], attention_mask=self.attention_mask(valid, n_act, embeds.dtype, p),
                 position_ids=positions[:, p:], past_key_values=cache, use_cache=True)
        return out.last_hidden_state[:, :-1]

    def forward(self, images, proprio, text_ids, text_valid, **kw) -> dict[str, torch.Tensor]:
        hidden = self.action_hidden(images, proprio, text_ids, text_valid, **kw)
        out = {"mean": self.action_head(hidden).float(), "hidden": hidden}  # hidden: what a value head reads
        if self.scale_head is not None:
            out["scale"] = self.scale_head(hidden)
        return out


def laplace_log_prob(actions: torch.Tensor, mean: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Element-wise log-density of Laplace(mean, scale): one 'token' per chunk step and action dim."""
    return -torch.log(2 * scale) - (actions - mean).abs() / scale
