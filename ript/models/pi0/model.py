"""π0's architecture from transformers parts, as openpi's PyTorch port lays it out: a SigLIP vision tower and a
Gemma language model read the prefix (each camera's 256 patch tokens, the prompt's tokens), a smaller Gemma, the
action expert, reads the suffix (a state token and the noisy action chunk mixed with the flow time) and attends
at every layer to the prefix's keys and values as well as its own. The prefix never sees the suffix, so its keys
and values are computed once per decision and every denoise step runs the expert alone.

It fills in the flow-model contract of ``ript.models.flow`` (``encode``, ``expert``, ``noise_std``), so the
flow policy's denoising and Flow-Noise / Flow-SDE RL run it unchanged.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GemmaConfig, SiglipVisionConfig, SiglipVisionModel
from transformers.models.gemma.modeling_gemma import GemmaDecoderLayer, GemmaRMSNorm, GemmaRotaryEmbedding
from transformers.models.gemma.modeling_gemma import apply_rotary_pos_emb as rotate

from ript.models.flow import Prefix

# openpi's variants (width, depth, mlp width, heads, kv heads, head dim); the tiny ones serve tests
GEMMA_VARIANTS = {"gemma_2b": (2048, 18, 16384, 8, 1, 256), "gemma_300m": (1024, 18, 4096, 8, 1, 256),
                  "gemma_tiny": (64, 2, 128, 2, 1, 32), "gemma_tiny_expert": (32, 2, 64, 2, 1, 32)}
SIGLIP_VARIANTS = {"so400m": (1152, 27, 4304, 16, 14, 224), "tiny": (32, 1, 64, 2, 14, 28)}
VOCAB = 257152


def gemma_config(variant: str, vocab: int) -> GemmaConfig:
    width, depth, mlp, heads, kv_heads, head_dim = GEMMA_VARIANTS[variant]
    return GemmaConfig(hidden_size=width, num_hidden_layers=depth, intermediate_size=mlp, num_attention_heads=heads,
                       num_key_value_heads=kv_heads, head_dim=head_dim, vocab_size=vocab,
                       hidden_act="gelu_pytorch_tanh", rms_norm_eps=1e-6)


def time_embedding(tau: torch.Tensor, width: int, min_period: float = 4e-3, max_period: float = 4.0) -> torch.Tensor:
    """π0's sinusoidal embedding (B, width) of flow times τ (B,): periods from ``min_period`` to ``max_period``."""
    fraction = torch.linspace(0.0, 1.0, width // 2, dtype=torch.float64, device=tau.device)
    period = min_period * (max_period / min_period) ** fraction
    angle = 2 * math.pi * tau.double()[:, None] / period[None]
    return torch.cat([angle.sin(), angle.cos()], dim=-1).float()


class JointDecoderLayer(GemmaDecoderLayer):
    """A Gemma decoder layer (its weights and their names unchanged) run by ``attend``, not ``forward``."""

    def attend(self, h: torch.Tensor, cos_sin, mask: torch.Tensor,
               past: tuple[torch.Tensor, torch.Tensor] | None = None):
        """The layer with its queries seeing ``past`` keys/values (the prefix's) before their own: (new hidden
        states, this stream's keys and values after RoPE)."""
        attn = self.self_attn
        b, t, _ = h.shape
        x = self.input_layernorm(h)
        q, k, v = (proj(x).view(b, t, -1, attn.head_dim).transpose(1, 2) for proj in (attn.q_proj, attn.k_proj,
                                                                                       attn.v_proj))
        q, k = rotate(q, k, *cos_sin)
        keys, values = (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
        out = F.scaled_dot_product_attention(q, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask,
                                             enable_gqa=True)
        h = h + attn.o_proj(out.transpose(1, 2).reshape(b, t, -1))
        h = h + self.mlp(self.post_attention_layernorm(h))
        return h, (k, v)


class Pi0Model(nn.Module):
    stage = "official"
    rescores_from_features = False  # the expert's cache is every prefix layer's keys and values: re-encode
    layer_methods = ("attend",)  # what runs its layers (rl.fsdp gathers each layer's weights around it)

    def __init__(self, paligemma_variant: str = "gemma_2b", action_expert_variant: str = "gemma_300m",
                 vision_variant: str = "so400m", action_dim: int = 32, action_horizon: int = 50,
                 vocab_size: int = VOCAB):
        super().__init__()
        self.action_dim, self.chunk_size = action_dim, action_horizon
        width, depth, mlp, heads, patch, size = SIGLIP_VARIANTS[vision_variant]
        self.image_size = size
        self.vision = SiglipVisionModel(SiglipVisionConfig(hidden_size=width, num_hidden_layers=depth,
                                                           intermediate_size=mlp, num_attention_heads=heads,
                                                           patch_size=patch, image_size=size, vision_use_head=False))
        prefix_cfg, expert_cfg = gemma_config(paligemma_variant, vocab_size), gemma_config(action_expert_variant, 1)
        if prefix_cfg.num_hidden_layers != expert_cfg.num_hidden_layers:
            raise ValueError("the action expert shares attention per layer: both Gemmas need the same depth")
        pw, ew = prefix_cfg.hidden_size, expert_cfg.hidden_size
        self.projector = nn.Linear(width, pw)
        self.embed_tokens = nn.Embedding(vocab_size, pw)
        depth = prefix_cfg.num_hidden_layers
        self.prefix_layers = nn.ModuleList(JointDecoderLayer(prefix_cfg, i) for i in range(depth))
        self.prefix_norm = GemmaRMSNorm(pw, eps=1e-6)
        self.expert_layers = nn.ModuleList(JointDecoderLayer(expert_cfg, i) for i in range(depth))
        self.expert_norm = GemmaRMSNorm(ew, eps=1e-6)
        self.rotary = GemmaRotaryEmbedding(prefix_cfg)
        self.state_proj = nn.Linear(action_dim, ew)
        self.action_in_proj = nn.Linear(action_dim, ew)
        self.action_time_mlp_in = nn.Linear(2 * ew, ew)
        self.action_time_mlp_out = nn.Linear(ew, ew)
        self.action_out_proj = nn.Linear(ew, action_dim)
        self.noise_head = nn.Linear(ew, action_dim)  # Flow-Noise's std per element (not in openpi's files: RL's)
        nn.init.zeros_(self.noise_head.weight)
        nn.init.zeros_(self.noise_head.bias)
        self.prefix_width, self.expert_width = pw, ew

    def expert_modules(self) -> list[nn.Module]:
        """The action expert and its projections: what πRL trains."""
        return [self.expert_layers, self.expert_norm, self.state_proj, self.action_in_proj, self.action_time_mlp_in,
                self.action_time_mlp_out, self.action_out_proj, self.noise_head]

    def expert_parameters(self) -> list[nn.Parameter]:
        return [p for part in self.expert_modules() for p in part.parameters()]

    def encode(self, images: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor, token_masks: torch.Tensor,
               state: torch.Tensor) -> Prefix:
        """Images (B, N, 3, S, S) in [-1, 1] with their masks (B, N), prompt tokens (B, T) with theirs, the
        normalised padded state (B, action_dim) -> the prefix's final hidden states and the expert's cache."""
        b, n = images.shape[:2]
        patches = self.vision(pixel_values=images.flatten(0, 1).to(self.projector.weight.dtype)).last_hidden_state
        image_tokens = self.projector(patches).view(b, n * patches.shape[1], -1)
        text = self.embed_tokens(tokens) * math.sqrt(self.prefix_width)
        h = torch.cat([image_tokens, text.to(image_tokens.dtype)], dim=1)
        pad = torch.cat([image_masks.repeat_interleave(patches.shape[1], dim=1), token_masks.bool()], dim=1)
        positions = pad.long().cumsum(1) - 1
        cos_sin = self.rotary(h, positions)
        mask = pad[:, None, None, :]  # bidirectional over the prefix's valid tokens
        kv = []
        for layer in self.prefix_layers:
            h, layer_kv = layer.attend(h, cos_sin, mask)
            kv.append(layer_kv)
        return Prefix(self.prefix_norm(h), {"kv": kv, "pad": pad, "offset": pad.sum(1), "state": state})

    def expert(self, x: torch.Tensor, tau: torch.Tensor, cache: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The suffix [state token, actions mixed with τ] through the expert at flow times τ (B,):
        (velocity (B, horizon, action_dim), the action tokens' last hidden states (B, horizon, expert width))."""
        dtype = self.action_in_proj.weight.dtype
        state = self.state_proj(cache["state"].to(dtype))[:, None]
        t = time_embedding(tau, self.expert_width).to(dtype)[:, None].expand(-1, x.shape[1], -1)
        actions = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(
            torch.cat([self.action_in_proj(x.to(dtype)), t], dim=-1))))
        h = torch.cat([state, actions], dim=1)
        s = h.shape[1]
        positions = cache["offset"][:, None] + torch.arange(s, device=h.device)[None]
        cos_sin = self.rotary(h, positions)
        # the state token sees the prefix and itself; the actions see the prefix, the state and each other
        own = torch.ones(s, s, dtype=torch.bool, device=h.device)
        own[0, 1:] = False
        mask = torch.cat([cache["pad"][:, None, :].expand(-1, s, -1), own[None].expand(len(h), -1, -1)], dim=2)
        for layer, past in zip(self.expert_layers, cache["kv"], strict=True):
            h, _ = layer.attend(h, cos_sin, mask[:, None], past)
        hidden = self.expert_norm(h)[:, 1:]
        return self.action_out_proj(hidden).float(), hidden

    def noise_std(self, hidden: torch.Tensor, low: float, high: float) -> torch.Tensor:
        return low + (high - low) * torch.sigmoid(self.noise_head(hidden).float())
