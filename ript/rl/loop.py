"""The RL loop, shared by every policy family: rollouts with dynamic sampling, PPO on the learner's log-probs,
metrics, per-iteration checkpoints and exact resume; alone or under torchrun (initial conditions split over
ranks, gradients all-reduced, rank 0 logs and checkpoints)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ript.config import to_dict
from ript.evaluation.runner import runner_from_metadata
from ript.envs.seeds import rank_seed
from ript.envs.suites import get_suite
from ript.errors import RiptError
from ript.model_loader import check_and_load
from ript.policies.base import ChunkingPolicy
from ript.rl.advantages import build_estimator
from ript.rl.critic import load_critic, write_learner_files
from ript.rl.learners import Learner
from ript.rl.history import RolloutHistory
from ript.rl.rollout import GroupSampling, collect_groups
from ript.rl.sampler import InitialConditionSampler
from ript.rl.update import make_optimizer, metric_names, ppo_update, update_batch
from ript.utils import distributed as ddist
from ript.utils import training
from ript.utils.checkpoint import load_weights, rank_state, restore_training_state, save_checkpoint, training_state
from ript.utils.logging import MetricLogger, log, setup_console_logging
from ript.utils.run_dir import prepare_ranked_run_dir
from ript.utils.seeding import seed_everything


def make_sampler(cfg, names: list[str], suite: str, info, k: int) -> InitialConditionSampler:
    pool = int(cfg.rl.ic_pool_size)
    limit = get_suite(suite).initial_conditions  # LIBERO: RL starts from the packaged init states (seed % 50)
    if limit is not None:
        pool = min(pool, limit)
    return InitialConditionSampler(names, rank_seed(int(cfg.seed), info.rank), pool, int(cfg.rl.skip_mastered_for),
                                   str(cfg.rl.task_weighting), k,
                                   floor=float(cfg.rl.task_weighting_floor))


def init_rank(cfg) -> tuple[str, ddist.DistInfo]:
    """This rank's device and distributed info. Every RL entry point calls it first, so that nothing is built
    before the rank's device is chosen (under torchrun each rank takes cuda:<local rank>)."""
    setup_console_logging()
    return ddist.init_rank(cfg.device)


def prepare_run(cfg, info) -> tuple:
    """(run dir, checkpoint to resume): every rank checks, then rank 0 creates the folder. Called once the
    inputs are loaded, so a failed start leaves nothing behind and no rank waits on a dead one."""
    run_dir, resume_from = prepare_ranked_run_dir(cfg, info)
    seed_everything(int(cfg.seed) + info.rank)
    return run_dir, resume_from


@dataclass
class RLRun:
    """What the RL loop works with besides the config, built by the stage that runs it."""
    cfg: Any
    info: ddist.DistInfo
    device: str
    learner: Learner
    policy: ChunkingPolicy
    task_names: list[str]
    metadata: dict          # the checkpoint's metadata (suite, render settings, sampling settings)
    ckpt_config: dict       # what every RL checkpoint's config.json holds
    run_dir: Path
    resume_from: Path | None
    evaluate: Callable[[int, MetricLogger], None]  # in-training evaluation at an iteration (rank 0; may do nothing)


def train_loop(run: RLRun) -> str:
    """The RL iterations, shared by every policy family: rollouts with dynamic sampling, PPO on the
    learner's log-probs, metrics, per-iteration checkpoints (weights: ``learner.weights``) and resume."""
    cfg, info, device, learner, policy = run.cfg, run.info, run.device, run.learner, run.policy
    names, metadata, ckpt_config, run_dir, resume_from = (run.task_names, run.metadata, run.ckpt_config, run.run_dir,
                                                          run.resume_from)
    estimator = build_estimator(cfg.rl)
    if estimator.uses_critic and learner.critic is None:
        raise RiptError(f"rl.advantage={cfg.rl.advantage} needs a critic, which {type(learner).__name__} does not "
                        f"have yet; use rloo or grpo")
    if cfg.rl.reward == "dense" and not get_suite(str(metadata.get("suite"))).shaped_reward:
        raise RiptError(f"rl.reward=dense: suite {metadata.get('suite')} has no shaped reward; use rl.reward=sparse")
    opt, sched = make_optimizer(learner, cfg, device)
    sampling = GroupSampling.from_config(cfg.rl)
    sampler = make_sampler(cfg, names, str(metadata.get("suite")), info, sampling.k)
    policy.record = True  # the contract's switch: keep what the update needs of every decision
    start_iter, run_id, env_steps_done = 0, None, 0  # env steps of the counted episodes, over all ranks
    if resume_from is not None:
        check_and_load(learner.weights, load_weights(resume_from), str(resume_from))
        if learner.critic is not None:
            load_critic(learner.critic, resume_from)
        start_iter, run_id, streams = restore_training_state(resume_from, opt, sched, info.rank, info.world_size)
        sampler.load_state_dict(streams["sampler"])
        policy.generator.set_state(streams["policy_rng"])
        env_steps_done = int(streams.get("env_steps", 0))
        log.info("rl: resumed from %s at iteration %d", resume_from, start_iter)
    logger = MetricLogger(run_dir, to_dict(cfg), run_id, enabled=info.is_main)
    history = RolloutHistory(run_dir, start_iter) if info.is_main else None
    # this rank's share of the host: its workers, and the cores they leave to the policy's host-side ops (the
    # other ranks' workers keep the rest busy)
    share = info.cores_per_rank()
    workers = share if cfg.rl.num_workers == "auto" else int(cfg.rl.num_workers)
    runner = runner_from_metadata(metadata, names, cfg.workers, episodes_per_task=1, num_workers=workers,
                                  max_episode_steps=cfg.rl.max_episode_steps, on_worker_failure="drop",
                                  episodes_at_once=sampling.most_episodes_per_round(info.world_size),
                                  driver_threads=max(1, share - workers))

    def save(iteration: int) -> None:
        mine = rank_state(sampler=sampler.state_dict(), policy_rng=policy.generator.get_state(),
                          env_steps=env_steps_done)
        ranks = ddist.gather_objects(mine, info)
        if info.is_main:
            state = training_state(opt, sched, iteration, logger.run_id, ranks)
            save_checkpoint(run_dir, iteration, learner.weights, ckpt_config, state, keep_last=cfg.keep_last,
                            write_extra=lambda folder: write_learner_files(learner, folder))
        ddist.barrier(info)

    def maybe_evaluate(iteration: int) -> None:
        run.evaluate(iteration, logger)
        ddist.barrier(info)

    t_start = time.perf_counter()
    try:
        if start_iter == 0 and cfg.eval.every:
            maybe_evaluate(0)
        for it in range(start_iter, int(cfg.rl.iterations)):
            sampler.start_iteration(it)
            t0 = time.perf_counter()
            inference_before = policy.inference_seconds
            every = int(cfg.rl.video_every)
            videos = run_dir / "videos" / f"iter{it + 1:05d}" if info.is_main and every and (it + 1) % every == 0 \
                else None
            batch = collect_groups(runner, policy, sampler, sampling, info, videos)
            t_rollout = time.perf_counter() - t0
            t1 = time.perf_counter()  # time/train covers collating (and rescoring) the decisions too
            data, targets = update_batch(learner, batch["kept"], estimator, cfg, device, info)
            t_prepare = time.perf_counter() - t1  # collating (observations to the device), advantages
            stats = ppo_update(learner, opt, sched, data, cfg, info, it, device)
            t_train = time.perf_counter() - t1
            eps = batch["episodes"]
            local = [len(eps), sum(e["success"] for e in eps), sum(e["length"] for e in eps),
                     0 if targets is None else float((targets.episode_advantages != 0).float().sum()),
                     policy.inference_seconds - inference_before, batch["env_steps"],
                     0 if targets is None else len(targets.episode_returns),
                     0 if targets is None else float(targets.episode_returns.sum())]
            by_task = [x for task in names for x in (sum(e["task"] == task for e in eps),
                                                      sum(e["success"] for e in eps if e["task"] == task))]
            summed = ddist.all_sum(local + by_task, info)  # one collective
            total, by_task = summed[:len(local)], summed[len(local):]
            per_task = {task: (int(by_task[2 * i]), int(by_task[2 * i + 1])) for i, task in enumerate(names)
                        if by_task[2 * i]}  # (episodes, successes) over all ranks
            if batch["capped"] and info.is_main:
                log.warning("rl iteration %d: only %d of %d groups were informative after %d sampling rounds; "
                            "training on those", it + 1, int(batch["total_kept"]), sampling.groups,
                            batch["rounds"])
            metrics = {
                "rollout/success_rate": total[1] / max(1, total[0]),
                "rollout/episodes": total[0],
                "rollout/groups_kept": batch["total_kept"],
                "rollout/kept_fraction": batch["total_kept"] * sampling.k / max(1, total[0]),
                "rollout/nonzero_advantage_fraction": total[3] / max(1, total[0]),
                "rollout/sampling_rounds": batch["rounds"],
                "rollout/dropped_episodes": batch["dropped"],
                "rollout/cancelled_episodes": batch["cancelled"],
                "rollout/returns_mean": total[7] / max(1, total[6]),  # the kept episodes' summed rewards
                **metric_names(stats),
                "time/rollout": t_rollout, "time/train": t_train, "time/train_prepare": t_prepare,
                "time/sync": batch["sync"] + stats["sync"],
                "time/inference_share": total[4] / max(1e-9, t_rollout * info.world_size),
                "time/env_steps_per_s": total[5] / max(1e-9, t_rollout),  # cancelled episodes' steps too
            }
            for task, (n, wins) in per_task.items():  # over all ranks
                metrics[f"rollout/success/{task}"] = wins / n
            env_steps_done += int(total[2])
            metrics["rollout/env_steps_total"] = env_steps_done
            logger.log(metrics, it + 1)
            if videos is not None:
                logger.log_videos(sorted(videos.glob("*.mp4")), "rollout/video", it + 1)
            if history is not None:
                history.add(it + 1, int(total[0]), int(total[1]), int(total[2]), per_task)
            if info.is_main:
                log.info("rl iteration %d/%d: rollout success %.1f%%, %d groups kept (%d rounds, %d episodes, %d "
                         "cancelled), clip %.3f, kl %.4f, %.1f s rollout (%.0f env steps/s) + %.1f s train (%.1f s of it "
                         "preparing the batch)", it + 1,
                         cfg.rl.iterations, 100 * metrics["rollout/success_rate"], batch["total_kept"], batch["rounds"],
                         int(total[0]), batch["cancelled"],
                         stats["clip_fraction"], stats["approx_kl"], t_rollout, metrics["time/env_steps_per_s"],
                         t_train, t_prepare)
                if learner.critic is not None:
                    log.info("rl iteration %d critic: value loss %.4f, explained variance %.3f, returns %.3f",
                             it + 1, stats["value_loss"], stats["explained_variance"], metrics["rollout/returns_mean"])
            save(it + 1)
            budget = cfg.rl.max_env_steps
            spent = budget is not None and env_steps_done >= int(budget)  # the same total on every rank
            if cfg.eval.every and ((it + 1) % int(cfg.eval.every) == 0 or it + 1 == int(cfg.rl.iterations) or spent):
                maybe_evaluate(it + 1)
            if spent:
                if info.is_main:
                    log.info("rl: %d env steps after iteration %d reach rl.max_env_steps=%d; done", env_steps_done,
                             it + 1, int(budget))
                break
            # every rank stops together, on rank 0's clock
            if ddist.all_sum([float(info.is_main and training.out_of_time(t_start, cfg.rl.stop_after_minutes))],
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
