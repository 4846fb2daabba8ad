"""The original OpenVLA behind the runners' policy interface: one action (D tokens, decoded autoregressively)
per decision for every env that needs one; greedy (the most likely bin per dimension, as OpenVLA evaluates)
or sampled from the softmax over the action bins for RL, recording the bins and their log-probs.

Inputs and outputs as OpenVLA-OFT's (``OFTPolicy``): one upright third-person image resized to the towers'
size, OpenVLA's prompt, actions un-normalised with q01/q99 and LIBERO's gripper convention. Bin ``b`` decodes
to the centre of the b-th of ``n_bins - 1`` equal intervals of [-1, 1] (the last bin shares the last centre).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

from ript.models.openvla.model import OpenVLA
from ript.policies.oft_policy import OFTPolicy


def prompt_batch(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, valid) of [BOS][pads][prompt]: pads right after BOS, so every row's prompt ends at the last column."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    valid = torch.zeros(ids.shape, dtype=torch.bool)
    for r, p in enumerate(prompts):
        start = width - len(p) + 1
        ids[r, 0], ids[r, start:] = p[0], torch.tensor(p[1:], dtype=torch.long)
        valid[r, 0], valid[r, start:] = True, True
    return ids, valid


def state_hidden(hidden: torch.Tensor) -> torch.Tensor:
    """What a value head reads: the hidden state predicting the first action token (B, 1, width), which depends
    on the observation and prompt only, not on the bins sampled after it."""
    return hidden[:, :1]


class OpenVLAPolicy(OFTPolicy):
    def __init__(self, model: OpenVLA, tokenizer, statistics: dict, instructions: dict[str, str],
                 image_keys: list[str], device: str | torch.device = "cpu", center_crop: bool = True,
                 gripper: str = "libero", sample: bool = False, seed: int = 0, amp: bool = True,
                 temperature: float = 1.0):
        model.cfg.action_dim = len(statistics["action"]["q01"])  # one token per action dimension
        super().__init__(model, tokenizer, statistics, instructions, image_keys, [], device, 1, center_crop,
                         gripper, sample, seed, amp)
        n = model.n_bins
        if tokenizer.vocab_size < n:
            raise ValueError(f"the tokenizer has {tokenizer.vocab_size} ids, fewer than the {n} action bins")
        self.action_ids = (tokenizer.vocab_size - 1 - torch.arange(n)).to(self.device)  # bin b -> its token id
        edges = torch.linspace(-1, 1, n)
        self.centers = ((edges[:-1] + edges[1:]) / 2).numpy()
        self.temperature = temperature

    def bin_log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution actions are sampled from and scored under: softmax over the bins at the temperature."""
        return F.log_softmax(logits.float() / self.temperature, dim=-1)

    def score_forward(self, inputs: dict, bins: torch.Tensor):
        """Teacher-forced (logits, hidden) at the positions predicting ``bins`` (RL's rescoring)."""
        ids, valid = prompt_batch(inputs["prompts"], self.pad)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
            return self.model.action_scores(inputs["images"].to(self.device), ids.to(self.device),
                                            valid.to(self.device), bins.to(self.device), self.action_ids)

    def _decode(self, inputs: dict, draws: torch.Tensor | None, dims: int | None = None):
        def choose(logits: torch.Tensor, dim: int) -> torch.Tensor:
            if draws is None:
                return logits.argmax(-1)
            cdf = self.bin_log_probs(logits).exp().cumsum(-1)  # inverse-CDF with the episode's own uniform
            return torch.searchsorted(cdf, draws[:, dim:dim + 1]).squeeze(1).clamp(max=logits.shape[-1] - 1)

        ids, valid = prompt_batch(inputs["prompts"], self.pad)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
            return self.model.decode(inputs["images"].to(self.device), ids.to(self.device), valid.to(self.device),
                                     self.action_ids, dims or self.action_dim, choose)

    @torch.no_grad()
    def plan(self, envs: list[int]) -> np.ndarray:
        inputs = self.inputs(envs)
        draws = self.env_draws(envs, lambda g: torch.rand(self.action_dim, generator=g, device=self.device)) \
            if not self.deterministic else None
        bins, logits, hidden = self._decode(inputs, draws)
        log_probs = self.bin_log_probs(logits).gather(-1, bins.unsqueeze(-1)).squeeze(-1)
        values = None if self.critic is None else self.critic(state_hidden(hidden))
        if self.record:
            for j, i in enumerate(envs):
                self.records[i].append({"images": inputs["images"][j].cpu(), "proprio": None,
                                        "prompt": inputs["prompts"][j], "actions": bins[j].cpu(),
                                        "log_probs": log_probs[j].float().cpu()})
                if values is not None:
                    self.records[i][-1]["value"] = values[j].float().cpu()
        normalized = self.centers[bins.clamp(max=len(self.centers) - 1).cpu().numpy()]
        return self.to_env(normalized[:, None, :])  # (envs, 1 step, D)

    def state_values(self, envs: list[int]) -> torch.Tensor:
        _, _, hidden = self._decode(self.inputs(envs), None, dims=1)  # the prompt's pass alone
        return self.critic(state_hidden(hidden))
