"""The PPO update, written once for every policy family: epochs of minibatches (micro-batches accumulate),
gradients averaged over ranks, the learner scoring the decisions; with a critic, its value loss beside the
policy's, each part clipped and stepped in its own parameter group."""

from __future__ import annotations

import math
import time

import torch

from ript.errors import RiptError
from ript.rl.advantages import normalize_over_ranks
from ript.rl.critic import explained_variance, value_loss
from ript.rl.objective import decision_weights, flow_matching_coef, ppo_loss, reference_kl
from ript.rl.rollout import flatten_groups
from ript.utils import distributed as ddist
from ript.utils import training
from ript.utils.fsdp import whole
from ript.utils.logging import log

# the update's metrics, RLinf's names; summed over micro-batches weighted by their share, averaged over updates
ACTOR_STATS = ("policy_loss", "clip_fraction", "dual_clip_fraction", "approx_kl", "ratio_mean", "entropy")
CRITIC_STATS = ("value_loss", "value_clip_fraction")
SHIFT_PROBE = 64  # decisions whose evaluation actions are compared before and after each update


class EvaluationShift:
    """How far an update moves the actions evaluation executes (``learner.evaluation_actions``): their root mean
    square change over the first ``SHIFT_PROBE`` decisions of the first epoch's order, in the policy's normalised
    units. A flow policy scored at one denoise step can move its ODE far while approx_kl stays small. Not
    measured under FSDP (a sharded forward runs on every rank in step) or for families that evaluate samples."""

    def __init__(self, learner, data: dict | None, orders: list[torch.Tensor], cfg, device: str, sharded: bool):
        self.learner, self.data, self.cfg, self.device = learner, data, cfg, device
        measured = learner.evaluation_shift_measured and data is not None and not sharded and orders
        self.probe = orders[0][:SHIFT_PROBE].to(device) if measured else None
        self.before = self._actions()

    @torch.no_grad()
    def _actions(self) -> torch.Tensor | None:
        if self.probe is None:
            return None
        self.learner.model.eval()
        micro = int(self.cfg.rl.get("micro_batch") or 0) or len(self.probe)  # the update's memory bound
        with training.autocast(self.device, self.cfg.amp):
            return torch.cat([self.learner.evaluation_actions(self.data, part)
                              for part in torch.split(self.probe, micro)])

    def current(self) -> float:
        """The change so far (0 where it is not measured)."""
        return 0.0 if self.before is None else float((self._actions() - self.before).pow(2).mean().sqrt())

    def measured(self) -> dict[str, float]:
        """{"eval_action_shift": the change} after the update; empty where it is not measured."""
        return {} if self.before is None else {"eval_action_shift": self.current()}


class EarlyStop:
    """``rl.target_kl`` / ``rl.target_eval_shift``: the update's epochs end after the optimiser step at which a
    minibatch's approx KL (read before its step, as Stable-Baselines3 reads it) or the evaluation actions' shift
    so far (``EvaluationShift``) passes its target on any rank; every rank stops at the same step (one all-reduce
    per step, only with a target set)."""

    def __init__(self, rl, shift: EvaluationShift, info):
        self.kl = None if rl.get("target_kl") is None else float(rl.target_kl)
        self.moved = None if rl.get("target_eval_shift") is None else float(rl.target_eval_shift)
        self.shift, self.info, self.stopped = shift, info, False

    def after_step(self, minibatch_kl) -> bool:
        """Whether the update stops after the step just taken, its minibatch's approx KL ``minibatch_kl``."""
        if self.kl is None and self.moved is None:
            return False
        over = 0.0 if self.kl is None else float(minibatch_kl) / self.kl
        if self.moved is not None:
            over = max(over, self.shift.current() / self.moved)
        self.stopped = ddist.all_max([over], self.info)[0] > 1.0
        return self.stopped


def minibatches(order: torch.Tensor, count: int, micro: int | None) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
    """(minibatch, its micro-batches) for one epoch's order, as the update runs them; empty minibatches are kept
    (every rank takes the same number of optimiser steps, so the gradient all-reduces pair up)."""
    out = []
    for chunk in torch.tensor_split(order, count):
        out.append((chunk, list(torch.split(chunk, micro)) if micro and len(chunk) else [chunk] if len(chunk) else []))
    return out


def micro_batch_plan(order: torch.Tensor, count: int, micro: int | None, most: int | None = None
                     ) -> list[list[tuple[torch.Tensor, float]]]:
    """Each minibatch of one epoch's order as its micro-batches and their weights (their share of it). With
    ``most`` (FSDP: the most decisions any rank holds) every rank runs as many micro-batches per minibatch as a
    rank holding ``most``: a sharded forward gathers weights from every rank, so all must run it in step; the
    extra ones score a real decision with weight 0."""
    plan = []
    widest = minibatches(torch.arange(most), count, micro) if most else None
    for i, (chunk, parts) in enumerate(minibatches(order, count, micro)):
        weighted = [(part, len(part) / len(chunk)) for part in parts]
        if widest is not None:
            weighted += [(order[:1], 0.0)] * max(0, len(widest[i][1]) - len(parts))
        plan.append(weighted)
    return plan


def epoch_orders(n: int, cfg, iteration: int) -> list[torch.Tensor]:
    """The order the update visits an iteration's n decisions in, per epoch (seeded: resumes repeat it)."""
    gen = torch.Generator().manual_seed(int(cfg.seed) * 1_000_003 + iteration)
    return [torch.randperm(n, generator=gen) for _ in range(int(cfg.rl.epochs))]


@torch.no_grad()
def rescore(learner, data: dict, cfg, device: str, order: torch.Tensor | None = None, most: int | None = None
            ) -> torch.Tensor:
    """The recorded decisions' log-probs under the training forward, before any update, in the micro-batches
    the first epoch will form from ``order`` (default: in order). In bf16 at 7B, log-probs depend on which
    decisions share a batch (prompt padding, kernel choice): OFT's step-0 forward in shuffled micro-batches was
    0.027 per action dimension from the rollout's values but 0.144 from an in-order rescoring (on an
    H100). Scored in the first epoch's own micro-batches, PPO's first ratios are 1 up to kernel choice.
    ``most``: as in ``micro_batch_plan`` (FSDP)."""
    learner.model.eval()
    n = len(data["old_log_probs"])
    order = torch.arange(n) if order is None else order
    out = torch.empty(data["old_log_probs"].shape, dtype=torch.float32, device=device)
    for parts in micro_batch_plan(order, int(cfg.rl.minibatches), int(cfg.rl.get("micro_batch") or 0) or None, most):
        for part, weight in parts:
            idx = part.to(device)
            with training.autocast(device, cfg.amp):
                scored = learner.score(data, idx).log_probs.float()
            if weight:
                out[idx] = scored
    return out


def state_copy(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of ``module``'s state where it lives (the update changes the originals in place)."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def weights_swapped(module: torch.nn.Module, state: dict[str, torch.Tensor]):
    """``module`` holds ``state`` inside the block and its own weights again after it."""
    own = module.state_dict()
    missing = sorted(set(own) ^ set(state))
    if missing:
        raise RiptError(f"the reference weights and the policy's differ in {missing[0]!r} ({len(missing)} names)")
    return training.tensors_swapped(list(own.values()), [state[name] for name in own])


def reference_state(learner, cfg) -> dict[str, torch.Tensor] | None:
    """With ``rl.kl_coef``: a copy of the trainable weights as the run loaded them from ``checkpoint`` (before
    any resume), the policy the KL term anchors to."""
    if not float(cfg.rl.get("kl_coef") or 0.0):
        return None
    return state_copy(learner.weights)


def update_batch(learner, kept: list[list[dict]], estimator, cfg, device: str, info) -> tuple[dict | None, object]:
    """(what PPO trains on, the estimator's targets) for an iteration's kept groups: the decisions collated by
    the learner, their advantages (normalised over ranks with ``rl.normalize_advantages``: every rank calls
    this, one with nothing kept too), with ``rl.loss_aggregation=episodes`` their weights in PPO's mean and, with
    a critic, the recorded values and the returns."""
    flat = flatten_groups(kept, estimator, str(cfg.rl.reward), float(cfg.rl.reward_scale))
    targets = None if flat is None else flat[1]
    advantages = None if targets is None else targets.advantages
    if cfg.rl.normalize_advantages:
        advantages = normalize_over_ranks(advantages, info)
    if flat is None:
        return None, None
    data = learner.collate(flat[0], device)
    data["advantages"] = advantages.to(device)
    if cfg.rl.get("loss_aggregation", "decisions") == "episodes":
        data["decision_weights"] = decision_weights([len(e["decisions"]) for g in kept for e in g]).to(device)
    if estimator.uses_critic:
        data["old_values"] = torch.stack([d["value"] for d in flat[0]]).float().to(device)
        data["returns"] = targets.returns.to(device)
    return data, targets


def zero_in_place(opt: torch.optim.Optimizer) -> None:
    """The optimizer's gradients zeroed in place, one parameter group at a time: a sharded model's (DTensors) and a
    critic's (plain tensors) cannot be zeroed in one fused call, as ``zero_grad(set_to_none=False)`` makes on a GPU."""
    for group in opt.param_groups:
        grads = [p.grad for p in group["params"] if p.grad is not None]
        if grads:
            torch._foreach_zero_(grads)


def make_optimizer(learner, cfg, device: str):
    """AdamW over the policy's parameters and, apart, the critic's (own learning rate, no weight decay), and a
    schedule per group: the policy warms up after ``rl.critic.warmup_iterations`` critic-only iterations."""
    rl = cfg.rl
    groups = [{"params": learner.params, "lr": float(rl.lr), "weight_decay": float(rl.weight_decay)}]
    warm = max(1, int(rl.warmup_iterations))
    lambdas = [lambda it: min(1.0, (it + 1) / warm)]
    if learner.critic is not None:
        groups.append({"params": list(learner.critic.parameters()), "lr": float(rl.critic.lr), "weight_decay": 0.0})
        critic_only = int(rl.critic.warmup_iterations)
        lambdas = [lambda it: 0.0 if it < critic_only else min(1.0, (it + 1 - critic_only) / warm),
                   lambda it: min(1.0, (it + 1) / warm)]
    opt = torch.optim.AdamW(groups, fused=device.startswith("cuda"))
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambdas)


def ppo_update(learner, opt, sched, data, cfg, info, iteration: int, device: str,
               reference: dict[str, torch.Tensor] | None = None, sharded: bool = False, anchor=None) -> dict:
    """PPO's epochs over an iteration's decisions; with ``reference`` (``reference_state``), a KL penalty to it
    weighted by ``rl.kl_coef``; ``sharded``: the learner's model is sharded with FSDP (``shard_learner``);
    ``anchor`` (``DemoAnchor``): its demo loss added at every optimiser step."""
    rl = cfg.rl
    critic = learner.critic
    critic_params = [] if critic is None else list(critic.parameters())
    stats = dict.fromkeys(ACTOR_STATS + ("grad_norm", "ratio_max"), 0.0)
    if reference is not None:
        stats["kl_to_reference"] = 0.0
    if flow_matching_coef(rl) > 0:
        stats["flow_matching_loss"] = 0.0
    if anchor is not None:
        stats["demo_loss"] = 0.0
    if critic is not None:
        stats.update(dict.fromkeys(CRITIC_STATS + ("critic_grad_norm",), 0.0))
        stats["explained_variance"] = float("nan") if data is None else \
            explained_variance(data["old_values"], data["returns"])
    n_updates, sync = 0, 0.0
    n = 0 if data is None else len(data["old_log_probs"])
    micro = int(rl.micro_batch or 0) or None  # decisions per forward/backward; gradients accumulate
    clip_c = None if rl.clip_ratio_c is None else float(rl.clip_ratio_c)
    orders = epoch_orders(n, cfg, iteration)
    most = sharded_forwards(n, info) if sharded else None
    if most == 0:  # a rank without decisions cannot run the sharded forwards: nobody updates this iteration
        orders = []
    # sharded parameters' gradients leave the backward averaged over ranks already
    averaged = ([] if sharded else learner.params) + critic_params
    if data is not None and orders and rl.get("recompute_old_log_probs"):
        data["old_log_probs"] = rescore(learner, data, cfg, device, orders[0], most)
    if data is not None and orders and reference is not None:
        with weights_swapped(learner.weights, reference):
            data["ref_log_probs"] = rescore(learner, data, cfg, device, orders[0], most)
    shift = EvaluationShift(learner, data, orders, cfg, device, sharded)
    learner.model.eval()  # no dropout: the recomputed log-probs must be those recorded at sampling time
    # Gradients live in buffers of their own and are zeroed in place: a first backward would otherwise adopt a
    # compiled scorer's CUDA-graph output as the gradient, which the next micro-batch's replay overwrites while
    # it is still being accumulated into (RuntimeError on the GPU). Parameters the loss does not reach keep
    # zero gradients, which AdamW turns into no change unless rl.weight_decay is set.
    for p in learner.params + critic_params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    stop = EarlyStop(rl, shift, info)
    for order in orders:
        for parts in micro_batch_plan(order, int(rl.minibatches), micro, most):
            zero_in_place(opt)
            minibatch_kl = 0.0
            for part, weight in parts:  # token means weighted to the minibatch's
                loss, s = micro_batch_loss(learner, data, part.to(device), cfg, device, clip_c, reference)
                (loss * weight).backward()
                minibatch_kl = minibatch_kl + s["approx_kl"].detach() * weight
                for key, v in s.items():  # on the device: no host synchronisation per micro-batch
                    stats[key] = torch.maximum(torch.as_tensor(stats[key], device=v.device), v.detach()) \
                        if key == "ratio_max" else stats[key] + v.detach() * weight
            if anchor is not None:  # drawn for this step alone: a resumed run draws the same
                demo = anchor.loss(iteration, n_updates)
                (anchor.coef * demo).backward()
                stats["demo_loss"] = stats["demo_loss"] + demo.detach()
            t = time.perf_counter()
            ddist.average_gradients(averaged, info)
            sync += time.perf_counter() - t
            norm, critic_norm = clipped_norms(learner.params, critic_params, stats["policy_loss"], rl, iteration)
            stats["grad_norm"] += norm
            if critic is not None:
                stats["critic_grad_norm"] += critic_norm
            opt.step()
            n_updates += 1
            if stop.after_step(minibatch_kl):
                break
        if stop.stopped:
            break
    sched.step()
    stats = {key: float(v) for key, v in stats.items()}
    for key in stats:
        if key not in ("ratio_max", "explained_variance"):
            stats[key] /= max(1, n_updates)
    stats["sync"] = sync
    stats.update(shift.measured(), optimizer_steps=n_updates)
    return stats


def micro_batch_loss(learner, data: dict, idx: torch.Tensor, cfg, device: str, clip_c: float | None,
                     reference: dict[str, torch.Tensor] | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One micro-batch's loss: PPO's clipped objective less the entropy bonus, with the KL penalty to the reference
    (``reference``) and the critic's value loss where there are; and its statistics, still on the device."""
    rl = cfg.rl
    with training.autocast(device, cfg.amp):
        scored = learner.score(data, idx)
    weights = data["decision_weights"][idx] if "decision_weights" in data else None
    loss, s = ppo_loss(scored.log_probs.float(), data["old_log_probs"][idx], data["advantages"][idx],
                       float(rl.clip_low), float(rl.clip_high), clip_c, weights)
    s["policy_loss"], s["entropy"] = loss.detach(), scored.entropy.float().mean().detach()
    loss = loss - float(rl.entropy_coef) * scored.entropy.float().mean()
    if reference is not None:
        kl = reference_kl(scored.log_probs.float(), data["ref_log_probs"][idx])
        s["kl_to_reference"] = kl.detach()
        loss = loss + float(rl.kl_coef) * kl
    fm_coef = flow_matching_coef(rl)
    if fm_coef > 0:
        fm_loss = (data["advantages"][idx].clamp(min=0) * scored.chunk_errors.float()).mean()
        s["flow_matching_loss"] = fm_loss.detach()
        loss = loss + fm_coef * fm_loss
    if learner.critic is not None:
        v_loss, vs = value_loss(scored.values.float(), data["old_values"][idx], data["returns"][idx],
                                None if rl.critic.value_clip is None else float(rl.critic.value_clip),
                                str(rl.critic.loss), float(rl.critic.huber_delta))
        s.update(vs, value_loss=v_loss.detach())
        loss = loss + float(rl.critic.value_coef) * v_loss
    return loss, s


def clipped_norms(params: list, critic_params: list, policy_loss, rl, iteration: int) -> tuple[float, float]:
    """The policy's and the critic's gradient norms before clipping them to ``rl.grad_clip``, read with the loss so
    far in one host synchronisation per optimiser step; a non-finite one of them stops the run before the step."""
    norms = torch.stack([whole(torch.nn.utils.clip_grad_norm_(group, float(rl.grad_clip))).float()
                         for group in (params, critic_params) if group])
    values = torch.cat([norms, torch.as_tensor(policy_loss, device=norms.device).reshape(1)]).tolist()
    norm, critic_norm = values[0], values[1] if critic_params else 0.0
    if not all(math.isfinite(v) for v in values):
        raise training.NonFiniteLoss(
            f"non-finite PPO loss or gradient (norm {norm}, critic {critic_norm}) in iteration "
            f"{iteration + 1}; no update applied, checkpoints/last is the last good checkpoint; lower rl.lr")
    return norm, critic_norm


def sharded_forwards(n: int, info) -> int:
    """Under FSDP: the most decisions any rank holds, which sets how many forwards every rank runs; 0 when a rank
    holds none (its forwards could score nothing)."""
    most, fewest_negated = ddist.all_max([float(n), -float(n)], info)
    if fewest_negated == 0:
        if info.is_main:
            log.warning("rl.fsdp: a rank kept no decisions this iteration; no rank updates")
        return 0
    return int(most)


def metric_names(stats: dict) -> dict:
    """The update's stats under RLinf's metric names (actor/..., critic/...)."""
    out = {}
    for key, v in stats.items():
        if key == "sync":
            continue
        if key in CRITIC_STATS or key == "explained_variance":
            out[f"critic/{key}"] = v
        elif key == "critic_grad_norm":
            out["critic/grad_norm"] = v
        else:
            out[f"actor/{key}"] = v
    return out
