"""The original OpenVLA: the towers, projector and Llama decoder OpenVLA-OFT shares, plus the LM head, with
each action dimension one token of ``n_action_bins`` (256) bins, decoded autoregressively.

Sequence layout (one row per env; pads sit inside the prompt and are masked out, positions skip them):

    [BOS] [image patches] [pad.. prompt..] [empty "▁"] [a_1] ... [a_{D-1}]

Causal attention; the hidden state at the empty token predicts a_1, at a_i it predicts a_{i+1}. Bin b is the
token ``tokenizer vocab - 1 - b`` (OpenVLA's action tokenizer uses the vocabulary's last ids); a policy over
actions is the softmax over those ids only, so sampling and RL's scoring compare like with like.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ript.models.openvla_oft.config import OFTConfig
from ript.models.openvla_oft.model import PrismaticBackbone


def causal_mask(valid: torch.Tensor, n_query: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive (B, 1, n_query, S) mask for the last ``n_query`` positions: causal, pads never seen."""
    s = valid.shape[1]
    q = torch.arange(s - n_query, s, device=valid.device)[:, None]
    k = torch.arange(s, device=valid.device)[None, :]
    allowed = valid[:, None, None, :] & (k <= q)[None, None]
    return torch.zeros(allowed.shape, dtype=dtype, device=valid.device).masked_fill(~allowed, torch.finfo(dtype).min)


class OpenVLA(PrismaticBackbone):
    def __init__(self, cfg: OFTConfig):
        super().__init__(cfg)
        self.lm_head = nn.Linear(cfg.llm_dim, int(cfg.text_config.get("vocab_size", 32064)), bias=False)
        self.n_bins = int(cfg.raw.get("n_action_bins", 256))

    def embed(self, images: torch.Tensor, text_ids: torch.Tensor, text_valid: torch.Tensor):
        """(embeddings, validity, positions) of [BOS][image patches][text...]."""
        emb = self.language_model.get_input_embeddings()(text_ids)
        vis = self.visual_tokens(images, None).to(emb.dtype)
        embeds = torch.cat([emb[:, :1], vis, emb[:, 1:]], dim=1)
        valid = torch.cat([text_valid[:, :1], text_valid.new_ones(vis.shape[:2]), text_valid[:, 1:]], dim=1)
        return embeds, valid, (valid.long().cumsum(1) - 1).clamp(min=0)

    def action_scores(self, images, text_ids, text_valid, bins: torch.Tensor, action_ids: torch.Tensor):
        """Teacher-forced: (logits over the bins (B, D, n_bins), hidden states (B, D, width)) at the D positions
        predicting the recorded ``bins`` (B, D), in one forward."""
        d = bins.shape[1]
        ids = torch.cat([text_ids, action_ids[bins[:, :-1]]], dim=1)
        valid = torch.cat([text_valid, text_valid.new_ones(len(bins), d - 1)], dim=1)
        embeds, valid, positions = self.embed(images, ids, valid)
        out = self.language_model(inputs_embeds=embeds, attention_mask=causal_mask(valid, valid.shape[1], embeds.dtype),
                                  position_ids=positions, use_cache=False)
        hidden = out.last_hidden_state[:, -d:]
        return self.lm_head(hidden)[..., action_ids], hidden

    def decode(self, images, text_ids, text_valid, action_ids: torch.Tensor, dims: int,
               choose: Callable[[torch.Tensor, int], torch.Tensor]):
        """Autoregressive, with a KV cache: ``choose(logits over the bins (B, n_bins), dim) -> bins (B,)`` picks
        each dimension's bin. Returns (bins (B, D), logits (B, D, n_bins), hidden (B, D, width))."""
        from transformers import DynamicCache

        embeds, valid, positions = self.embed(images, text_ids, text_valid)
        cache, lm = DynamicCache(), self.language_model
        out = lm(inputs_embeds=embeds, attention_mask=causal_mask(valid, valid.shape[1], embeds.dtype),
                 position_ids=positions, past_key_values=cache, use_cache=True)
        hidden, picked, logits = [out.last_hidden_state[:, -1]], [], []
        position = positions[:, -1:]
        for dim in range(dims):
            logits.append(self.lm_head(hidden[-1])[..., action_ids])
            picked.append(choose(logits[-1], dim))
            if dim == dims - 1:
                break
            valid = torch.cat([valid, valid.new_ones(len(valid), 1)], dim=1)
            position = position + 1
            step = lm.get_input_embeddings()(action_ids[picked[-1]]).unsqueeze(1)
            out = lm(inputs_embeds=step, attention_mask=causal_mask(valid, 1, step.dtype), position_ids=position,
                     past_key_values=cache, use_cache=True)
            hidden.append(out.last_hidden_state[:, -1])
        return torch.stack(picked, 1), torch.stack(logits, 1), torch.stack(hidden, 1)
