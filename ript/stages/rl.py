"""RL fine-tuning of a chunk policy from sparse success rewards: leave-one-out PPO (RIPT) with dynamic sampling.

Each iteration: draw initial conditions, run K rollouts from each (one batched policy call per decision for
all envs), drop groups whose rewards are all equal and draw more until B informative groups are kept or
the round cap is hit; then a few PPO epochs over the kept decisions, recomputing only the prior on the
contexts cached at sampling time. Runs alone or under torchrun (initial conditions split over ranks,
gradients all-reduced, rank 0 logs and checkpoints).
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from ript.config import resolve_device
from ript.envs.runner import EnvRunner, EpisodeSpec
from ript.envs.seeds import rank_seed
from ript.envs.suites import get_suite
from ript.errors import RiptError
from ript.model_loader import check_and_load, load_model
from ript.registry import ADVANTAGES
from ript.rl import advantages as _advantages  # noqa: F401  (registers the estimators)
from ript.rl.objective import ppo_loss, token_log_probs
from ript.rl.sampler import InitialConditionSampler
from ript.stages import common
from ript.stages.evaluate import evaluate_during_training, make_policy, make_runner, sampling_settings
from ript.utils import distributed as ddist
from ript.utils.checkpoint import load_training_state, load_weights, save_checkpoint
from ript.utils.logging import MetricLogger, log, setup_console_logging
from ript.utils.seeding import rng_state, seed_everything, set_rng_state


def trainable_parameters(model, prior_only: bool) -> list[torch.nn.Parameter]:
    model.requires_grad_(False)
    parts = [model.gpt, model.tok_emb, model.head] if prior_only else [model]
    for part in parts:
        part.requires_grad_(True)
    model.pos_emb.requires_grad_(True)
    if not prior_only:
        model.autoencoder.requires_grad_(False)  # the decoder stays the stage-0/finetune one
    return [p for p in model.parameters() if p.requires_grad]


def collect_groups(runner: EnvRunner, policy, sampler: InitialConditionSampler, cfg, info) -> dict:
    """Dynamic sampling: rounds of K rollouts per initial condition until B informative groups (over all ranks)."""
    rl = cfg.rl
    k = int(rl.rollouts_per_group)
    local_target = math.ceil(int(rl.groups_per_iteration) / info.world_size)
    kept, episodes, rounds, sync, dropped = [], [], 0, 0.0, 0
    while True:
        need = max(0, local_target - len(kept))
        ics = sampler.draw(need)
        # episode index g*K + j: group g of this round, even when two draws share an initial condition
        specs = [EpisodeSpec(task, seed, g * k + j) for g, (task, seed) in enumerate(ics) for j in range(k)]
        results = runner.run(policy, specs=specs) if specs else {"episodes": [], "dropped": 0}
        dropped += results["dropped"]
        for group in group_episodes(results["episodes"], k):
            rewards = [float(e["success"]) for e in group]
            sampler.record((group[0]["task"], group[0]["seed"]), rewards)
            episodes.extend(group)
            if len(set(rewards)) > 1:
                kept.append(group)
        rounds += 1
        t = time.perf_counter()
        total_kept = ddist.all_sum([len(kept)], info)[0]
        sync += time.perf_counter() - t
        if total_kept >= int(rl.groups_per_iteration) or rounds >= int(rl.max_sampling_rounds):
            break
    capped = total_kept < int(rl.groups_per_iteration)
    return {"kept": kept, "episodes": episodes, "rounds": rounds, "capped": capped, "total_kept": total_kept,
            "sync": sync, "dropped": dropped}


def group_episodes(episodes: list[dict], k: int) -> list[list[dict]]:
    """Split one round's episodes into its groups of K rollouts (episode index g*K + j), in draw order. A
    group that lost a rollout to a failed env worker is left out whole (its leave-one-out baseline needs K)."""
    groups: dict[int, list[dict]] = {}
    for e in episodes:
        groups.setdefault(e["episode"] // k, []).append(e)
    out = []
    for g in sorted(groups):
        group = sorted(groups[g], key=lambda e: e["episode"])
        if len({(e["task"], e["seed"]) for e in group}) != 1 or len({e["episode"] for e in group}) != len(group):
            raise RuntimeError(f"rollout group {g} is malformed: {len(group)} episodes for K={k}")
        if len(group) == k:
            out.append(group)
    return out


def flatten_groups(kept: list[list[dict]], estimator: str) -> tuple[list[dict], torch.Tensor, torch.Tensor] | None:
    """The kept groups' decisions in order, each decision's advantage, and the (groups, K) advantages."""
    if not kept:
        return None
    rewards = torch.tensor([[float(e["success"]) for e in g] for g in kept])
    adv = ADVANTAGES.get(estimator)(rewards)
    decisions, per_decision = [], []
    for g, group in enumerate(kept):
        for j, e in enumerate(group):
            decisions.extend(e["decisions"])
            per_decision.extend([adv[g, j]] * len(e["decisions"]))
    return decisions, torch.stack(per_decision).float(), adv


class ChunkLearner:
    """What the RL loop needs from a chunk policy: its trainable parameters, and token log-probs recomputed
    on what was cached at sampling time: the contexts when only the prior trains, else the observations
    (so the gradient reaches the observation encoders)."""

    def __init__(self, model, settings: dict, prior_only: bool):
        self.model, self.settings = model, settings
        self.params = trainable_parameters(model, prior_only)
        self.weights = model  # what checkpoints hold
        self.encodes = not prior_only

    def attach(self, policy) -> None:
        policy.record_obs = self.encodes

    def collate(self, decisions: list[dict], device: str) -> dict:
        data = {"tokens": torch.stack([d["tokens"] for d in decisions]).to(device),
                "old_log_probs": torch.stack([d["log_probs"] for d in decisions]).float().to(device)}
        if self.encodes:
            data["obs"] = {k: torch.stack([d["obs"][k] for d in decisions]).to(device) for k in decisions[0]["obs"]}
            data["task_ids"] = torch.tensor([d["task_id"] for d in decisions], device=device)
        else:
            data["context"] = torch.stack([d["context"] for d in decisions]).to(device)
        return data

    def log_probs(self, data: dict, idx: torch.Tensor) -> torch.Tensor:
        if self.encodes:
            context = self.model.context({k: v[idx] for k, v in data["obs"].items()}, data["task_ids"][idx])
        else:
            context = data["context"][idx]
        return token_log_probs(self.model, context, data["tokens"][idx], float(self.settings["temperature"]),
                               self.settings.get("top_k"))


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
        with common.autocast(device, cfg.amp):
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
                with common.autocast(device, cfg.amp):
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
                raise common.NonFiniteLoss(
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


def make_sampler(cfg, names: list[str], suite: str, info) -> InitialConditionSampler:
    pool = int(cfg.rl.ic_pool_size)
    limit = get_suite(suite).initial_conditions  # LIBERO: RL starts from the packaged init states (seed % 50)
    if limit is not None:
        pool = min(pool, limit)
    return InitialConditionSampler(names, rank_seed(int(cfg.seed), info.rank), pool, int(cfg.rl.skip_mastered_for),
                                   str(cfg.rl.task_weighting), int(cfg.rl.rollouts_per_group),
                                   floor=float(cfg.rl.task_weighting_floor))


def init_rank(cfg) -> tuple[str, ddist.DistInfo]:
    """This rank's device and distributed info. Every RL entry point calls it first, so that nothing is built
    before the rank's device is chosen (under torchrun each rank takes cuda:<local rank>)."""
    setup_console_logging()
    device = resolve_device(cfg.device)
    info = ddist.init_distributed(device)
    if device == "cuda" and info.world_size > 1:
        device = f"cuda:{info.local_rank}"
        torch.cuda.set_device(device)
    return device, info


def prepare_run(cfg, info) -> tuple:
    """(run dir, checkpoint to resume): every rank checks, then rank 0 creates the folder. Called once the
    inputs are loaded, so a failed start leaves nothing behind and no rank waits on a dead one."""
    run_dir, resume_from = common.prepare_run_dir(cfg, create=False)
    ddist.barrier(info)
    if info.is_main:
        common.prepare_run_dir(cfg)
    ddist.barrier(info)
    seed_everything(int(cfg.seed) + info.rank)
    return run_dir, resume_from


def run(cfg) -> str:
    if not cfg.checkpoint:
        raise RiptError("rl needs checkpoint=<stage-1, finetune or rl checkpoint>")
    device, info = init_rank(cfg)
    model, base = load_model(cfg.checkpoint, expect_stage=("stage1", "finetune", "rl"), device=device)
    run_dir, resume_from = prepare_run(cfg, info)
    names = list(cfg.task_names) if cfg.task_names else model.task_names
    for name in names:
        model.task_index(name)
    settings = sampling_settings(base, dict(cfg.sampling))
    learner = ChunkLearner(model, settings, bool(cfg.rl.train_prior_only))
    policy = make_policy(model, settings, device, rank_seed(int(cfg.seed), info.rank), bool(cfg.cuda_graph))
    learner.attach(policy)
    metadata = {**base["metadata"], "base_checkpoint": base["checkpoint_dir"], "sampling": settings}
    ckpt_config = common.checkpoint_config("rl", "skill_prior", base["model_kwargs"], cfg, metadata)
    eval_runner = make_runner(metadata, names, cfg.eval, cfg.workers) if info.is_main and cfg.eval.every else None

    def evaluate(iteration: int, logger) -> None:
        if eval_runner is not None:
            evaluate_during_training(eval_runner, model, settings, device, int(cfg.eval.seed),
                                     run_dir / "eval" / f"iter{iteration:04d}", logger, iteration,
                                     f"rl iteration {iteration}", bool(cfg.cuda_graph))

    try:
        return train_loop(cfg, info, device, learner, policy, names, metadata, ckpt_config, run_dir, resume_from,
                          evaluate)
    finally:
        if eval_runner is not None:
            eval_runner.close()


def train_loop(cfg, info, device, learner, policy, names, metadata, ckpt_config, run_dir, resume_from,
               evaluate) -> str:
    """The RL iterations, shared by every policy family: rollouts with dynamic sampling, PPO on the
    learner's log-probs, metrics, per-iteration checkpoints (weights: ``learner.weights``) and resume."""
    params = learner.params
    opt = torch.optim.AdamW(params, lr=float(cfg.rl.lr), weight_decay=float(cfg.rl.weight_decay),
                            fused=device.startswith("cuda"))
    warm = max(1, int(cfg.rl.warmup_iterations))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: min(1.0, (it + 1) / warm))
    sampler = make_sampler(cfg, names, str(metadata.get("suite")), info)
    policy.record = True
    start_iter, run_id = 0, None
    if resume_from is not None:
        check_and_load(learner.weights, load_weights(resume_from), str(resume_from))
        state = load_training_state(resume_from)
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        rank_state = state["ranks"][info.rank]
        set_rng_state(rank_state["rng"])
        sampler.load_state_dict(rank_state["sampler"])
        policy.generator.set_state(rank_state["policy_rng"])
        start_iter, run_id = int(state["iteration"]), state["logger_run_id"]
        log.info("rl: resumed from %s at iteration %d", resume_from, start_iter)
    logger = MetricLogger(run_dir, common.to_dict(cfg), run_id, enabled=info.is_main)
    env_args = metadata["env_args"]
    runner = EnvRunner(metadata["suite"], names, env_args["render"],
                       int(cfg.rl.max_episode_steps or env_args["max_episode_steps"]), episodes_per_task=1,
                       num_workers=cfg.rl.num_workers, worker_timeout_s=float(cfg.workers.timeout_s),
                       max_worker_restarts=int(cfg.workers.max_restarts), on_worker_failure="drop")

    def save(iteration: int) -> None:
        rank_state = {"rng": rng_state(), "sampler": sampler.state_dict(), "policy_rng": policy.generator.get_state()}
        ranks = [rank_state]
        if info.world_size > 1:
            ranks = [None] * info.world_size
            dist.all_gather_object(ranks, rank_state)
        if info.is_main:
            state = {"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "iteration": iteration,
                     "ranks": ranks, "logger_run_id": logger.run_id}
            save_checkpoint(run_dir, iteration, learner.weights, ckpt_config, state, keep_last=cfg.keep_last)
        ddist.barrier(info)

    def maybe_evaluate(iteration: int) -> None:
        evaluate(iteration, logger)
        ddist.barrier(info)

    t_start = time.perf_counter()
    try:
        if start_iter == 0 and cfg.eval.every:
            maybe_evaluate(0)
        for it in range(start_iter, int(cfg.rl.iterations)):
            sampler.iteration = it
            t0 = time.perf_counter()
            policy.inference_seconds = 0.0
            batch = collect_groups(runner, policy, sampler, cfg, info)
            t_rollout = time.perf_counter() - t0
            t1 = time.perf_counter()  # time/train covers collating and rescoring the decisions too
            flat = flatten_groups(batch["kept"], str(cfg.rl.advantage))
            data = None
            if flat is not None:
                data = learner.collate(flat[0], device)
                data.update(advantages=flat[1].to(device), group_advantages=flat[2])
                if cfg.rl.get("recompute_old_log_probs"):
                    data["old_log_probs"] = rescore(learner, data, cfg, device)
            stats = ppo_update(learner, opt, sched, data, cfg, info, it, device)
            t_train = time.perf_counter() - t1
            eps = batch["episodes"]
            local = [len(eps), sum(e["success"] for e in eps), sum(e["length"] for e in eps),
                     0 if data is None else float((data["group_advantages"] != 0).float().sum()),
                     policy.inference_seconds]
            total = ddist.all_sum(local, info)
            if batch["capped"] and info.is_main:
                log.warning("rl iteration %d: only %d of %d groups were informative after %d sampling rounds; "
                            "training on those", it + 1, int(batch["total_kept"]), cfg.rl.groups_per_iteration,
                            batch["rounds"])
            metrics = {
                "rollout/success_rate": total[1] / max(1, total[0]),
                "rollout/episodes": total[0],
                "rollout/groups_kept": batch["total_kept"],
                "rollout/kept_fraction": batch["total_kept"] * int(cfg.rl.rollouts_per_group) / max(1, total[0]),
                "rollout/nonzero_advantage_fraction": total[3] / max(1, total[0]),
                "rollout/sampling_rounds": batch["rounds"],
                "rollout/dropped_episodes": batch["dropped"],
                **{f"train/{k}": v for k, v in stats.items() if k != "sync"},
                "time/rollout": t_rollout, "time/train": t_train, "time/sync": batch["sync"] + stats["sync"],
                "time/inference_share": total[4] / max(1e-9, t_rollout * info.world_size),
                "time/env_steps_per_s": total[2] / max(1e-9, t_rollout),
            }
            for task in names:
                task_eps = [e for e in eps if e["task"] == task]
                if task_eps:
                    metrics[f"rollout/success/{task}"] = sum(e["success"] for e in task_eps) / len(task_eps)
            logger.log(metrics, it + 1)
            if info.is_main:
                log.info("rl iteration %d/%d: rollout success %.1f%%, %d groups kept (%d rounds), clip %.3f, "
                         "kl %.4f, %.0f s rollout + %.0f s train", it + 1, cfg.rl.iterations,
                         100 * metrics["rollout/success_rate"], batch["total_kept"], batch["rounds"],
                         stats["clip_fraction"], stats["approx_kl"], t_rollout, t_train)
            save(it + 1)
            if cfg.eval.every and ((it + 1) % int(cfg.eval.every) == 0 or it + 1 == int(cfg.rl.iterations)):
                maybe_evaluate(it + 1)
            # every rank stops together, on rank 0's clock
            if ddist.all_sum([float(info.is_main and common.out_of_time(t_start, cfg.rl.stop_after_minutes))],
                             info)[0] > 0:
                if info.is_main:
                    log.info("rl: stopped after %s min at iteration %d; continue with resume=true",
                             cfg.rl.stop_after_minutes, it + 1)
                break
    finally:
        runner.close()
        logger.close()
        ddist.shutdown(info)
    return str(run_dir)
