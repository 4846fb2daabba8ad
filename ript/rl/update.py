"""The PPO update, written once for every policy family: epochs of minibatches (micro-batches accumulate),
gradients averaged over ranks, the learner supplying the log-probs."""

from __future__ import annotations

import math
import time

import torch

from ript.rl.objective import ppo_loss
from ript.utils import distributed as ddist
from ript.utils import training


@torch.no_grad()
def rescore(learner, data: dict, cfg, device: str) -> torch.Tensor:
    """The recorded decisions' log-probs under the training forward (micro-batches, autocast), before any
    update. In bf16 at 7B the rollout's batch of envs and a training micro-batch round differently (mean
    gap ~0.03 per action dimension, a few percent beyond the clip range, measured on an H100); scored by
    the same forward as the new log-probs, PPO's ratio starts at 1 up to how micro-batches are composed."""
    learner.model.eval()
    n = len(data["old_log_probs"])
    size = int(cfg.rl.get("micro_batch") or 0) or n
    out = []
    for idx in torch.arange(n, device=device).split(size):
        with training.autocast(device, cfg.amp):
            out.append(learner.log_probs(data, idx).float())
    return torch.cat(out)


def ppo_update(learner, opt, sched, data, cfg, info, iteration: int, device: str) -> dict:
    rl = cfg.rl
    params = learner.params
    stats: dict[str, float] = {"loss": 0.0, "clip_fraction": 0.0, "approx_kl": 0.0, "ratio_mean": 0.0,
                               "ratio_max": 0.0, "grad_norm": 0.0}
    n_updates, sync = 0, 0.0
    n = 0 if data is None else len(data["old_log_probs"])
    micro = int(rl.micro_batch or 0) or None  # decisions per forward/backward; gradients accumulate
    gen = torch.Generator().manual_seed(int(cfg.seed) * 1_000_003 + iteration)
    learner.model.eval()  # no dropout: the recomputed log-probs must be those recorded at sampling time
    for _ in range(int(rl.epochs)):
        order = torch.randperm(n, generator=gen)
        # every rank takes the same number of optimizer steps, so the gradient all-reduces pair up
        for chunk in torch.tensor_split(order, int(rl.minibatches)):
            opt.zero_grad(set_to_none=True)
            for part in (torch.split(chunk, micro) if micro and len(chunk) else [chunk] if len(chunk) else []):
                idx, weight = part.to(device), len(part) / len(chunk)  # token means weighted to the minibatch's
                with training.autocast(device, cfg.amp):
                    new_lp = learner.log_probs(data, idx)
                loss, s = ppo_loss(new_lp.float(), data["old_log_probs"][idx], data["advantages"][idx],
                                   float(rl.clip_low), float(rl.clip_high))
                (loss * weight).backward()
                for key, v in s.items():
                    stats[key] = max(stats[key], float(v)) if key == "ratio_max" else stats[key] + float(v) * weight
                stats["loss"] += loss.item() * weight
            t = time.perf_counter()
            ddist.average_gradients(params, info)
            sync += time.perf_counter() - t
            norm = float(torch.nn.utils.clip_grad_norm_(params, float(rl.grad_clip)))
            if not (math.isfinite(norm) and math.isfinite(stats["loss"])):
                raise training.NonFiniteLoss(
                    f"non-finite PPO loss or gradient (norm {norm}) in iteration {iteration + 1}; no update applied, "
                    f"checkpoints/last is the last good checkpoint; lower rl.lr")
            stats["grad_norm"] += norm
            opt.step()
            n_updates += 1
    sched.step()
    for key in ("loss", "clip_fraction", "approx_kl", "ratio_mean"):
        stats[key] /= max(1, n_updates)
    stats["grad_norm"] /= max(1, n_updates)
    stats["sync"] = sync
    return stats
