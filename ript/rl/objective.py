"""PPO's clipped objective on the prior's token log-probs, scored under the sampling distribution."""

from __future__ import annotations

import torch

from ript.models.prior import SkillPrior, processed_log_probs


def token_log_probs(model: SkillPrior, context: torch.Tensor, tokens: torch.Tensor, temperature: float,
                    top_k: int | None) -> torch.Tensor:
    """Log-probs of ``tokens`` (N, T) given cached contexts, with the temperature and top-k used to sample."""
    logits = model.logits(context, model.tokens_in(tokens))
    return processed_log_probs(logits, temperature, top_k).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def ppo_loss(new_log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
             clip_low: float, clip_high: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-mean clipped surrogate. log-probs (N, T); advantages (N,), shared by a decision's tokens."""
    log_ratio = new_log_probs - old_log_probs
    ratio = log_ratio.exp()
    adv = advantages.unsqueeze(-1).expand_as(ratio)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip_low, 1 + clip_high) * adv)
    loss = -surrogate.mean()
    with torch.no_grad():
        finite = torch.isfinite(log_ratio)
        stats = {
            "clip_fraction": ((ratio < 1 - clip_low) | (ratio > 1 + clip_high)).float().mean(),
            # k3 estimator of KL(old || new), over tokens still inside the new top-k
            "approx_kl": ((ratio - 1) - log_ratio)[finite].mean() if finite.any() else ratio.new_zeros(()),
            "ratio_mean": ratio.mean(),
            "ratio_max": ratio.max(),
        }
    return loss, stats
