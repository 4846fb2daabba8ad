"""PPO's clipped objective on the policy's log-probs, scored under the sampling distribution."""

from __future__ import annotations

import torch

from ript.models.prior import SkillPrior, processed_log_probs


def flow_matching_coef(rl_cfg) -> float:
    """``rl.flow_matching_coef``: the weight of the advantage-weighted flow-matching term (0: off; absent from
    configs written before it)."""
    return float(rl_cfg.get("flow_matching_coef") or 0)


def token_scores(model: SkillPrior, context: torch.Tensor, tokens: torch.Tensor, temperature: float,
                 top_k: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs (N, T) of ``tokens`` given cached contexts, with the temperature and top-k used to sample,
    and each decision's mean entropy per token (N,) of that distribution."""
    log_p = processed_log_probs(model.logits(context, model.tokens_in(tokens)), temperature, top_k)
    p = log_p.exp()
    entropy = -(p * log_p.masked_fill(p == 0, 0.0)).sum(-1).mean(-1)  # top-k's excluded tokens add nothing
    return log_p.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), entropy


def token_log_probs(model: SkillPrior, context: torch.Tensor, tokens: torch.Tensor, temperature: float,
                    top_k: int | None) -> torch.Tensor:
    return token_scores(model, context, tokens, temperature, top_k)[0]


def ppo_loss(new_log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
             clip_low: float, clip_high: float, clip_ratio_c: float | None = None,
             weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-mean clipped surrogate. log-probs (N, T); advantages (N,), shared by a decision's tokens; ``weights``
    (N,), each decision's weight in the mean (``decision_weights``; none: all 1). With ``clip_ratio_c`` (dual
    clip), a negative advantage's loss is at most ``clip_ratio_c * |A|``, so one very unlikely sampled token cannot
    dominate the batch."""
    log_ratio = new_log_probs - old_log_probs
    ratio = log_ratio.exp()
    adv = advantages.unsqueeze(-1).expand_as(ratio)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip_low, 1 + clip_high) * adv)
    dual_clipped = torch.zeros_like(ratio, dtype=torch.bool)
    if clip_ratio_c is not None:
        floor = clip_ratio_c * adv
        dual_clipped = (adv < 0) & (surrogate < floor)
        surrogate = torch.where(adv < 0, torch.maximum(surrogate, floor), surrogate)
    loss = -(surrogate if weights is None else surrogate * weights.unsqueeze(-1)).mean()
    with torch.no_grad():
        finite = torch.isfinite(log_ratio)
        stats = {
            "clip_fraction": ((ratio < 1 - clip_low) | (ratio > 1 + clip_high)).float().mean(),
            "dual_clip_fraction": dual_clipped.float().mean(),
            # k3 estimator of KL(old || new), over tokens still inside the new top-k
            "approx_kl": ((ratio - 1) - log_ratio)[finite].mean() if finite.any() else ratio.new_zeros(()),
            "ratio_mean": ratio.mean(),
            "ratio_max": ratio.max(),
        }
    return loss, stats


def decision_weights(episode_lengths: list[int]) -> torch.Tensor:
    """Each decision's weight when every episode weighs the same (``rl.loss_aggregation=episodes``): 1 / its
    episode's length, scaled so that the weights average 1 over the decisions (the mean's scale is the decision
    mean's, and so is the learning rate's meaning). (sum of lengths,)"""
    lengths = torch.tensor(episode_lengths, dtype=torch.long)
    per_decision = torch.repeat_interleave(1.0 / lengths.clamp(min=1).float(), lengths)
    return per_decision * (len(per_decision) / per_decision.sum())


def reference_kl(new_log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """KL(new || reference) estimated on the sampled tokens or actions (the k3 estimator, GRPO's KL term):
    exp(ref - new) - (ref - new) - 1, never negative, zero where the two agree; its mean over the entries both
    policies can produce (top-k may exclude a token from either)."""
    diff = ref_log_probs - new_log_probs
    finite = torch.isfinite(diff)
    safe = torch.where(finite, diff, torch.zeros_like(diff))
    return torch.where(finite, safe.exp() - safe - 1, torch.zeros_like(diff)).sum() / finite.sum().clamp(min=1)
