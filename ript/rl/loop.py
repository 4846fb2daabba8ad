"""The RL loop, shared by every policy family: rollouts with dynamic sampling, PPO on the learner's log-probs,
metrics, per-iteration checkpoints and exact resume; alone or under torchrun (initial conditions split over
ranks, gradients all-reduced, rank 0 logs and checkpoints)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ript.config import to_dict
from ript.envs.episodes import Runner
from ript.envs.seeds import rank_seed
from ript.envs.suites import get_suite
from ript.errors import RiptError
from ript.model_loader import check_and_load
from ript.policies.base import ChunkingPolicy
from ript.rl.advantages import build_estimator
from ript.rl.critic import load_critic, write_learner_files
from ript.rl.demo_anchor import demo_anchor
from ript.rl.history import UPDATE_RECORD, RolloutHistory
from ript.rl.learners import Learner, check_same_start, shard_learner
from ript.rl.objective import flow_matching_coef
from ript.rl.overlap import RolloutsAhead, rollout_weights
from ript.rl.refresh import WorldModelRefresh
from ript.rl.rollout import GroupSampling, collect_groups
from ript.rl.sampler import InitialConditionSampler
from ript.rl.update import make_optimizer, metric_names, ppo_update, reference_state, update_batch
from ript.utils import distributed as ddist
from ript.utils.checkpoint import load_weights
from ript.utils.device import take_peak_memory_gib
from ript.utils.fsdp import ShardedState, WholeState
from ript.utils.logging import MetricLogger, log, setup_console_logging
from ript.utils.run_dir import prepare_ranked_run_dir
from ript.utils.seeding import restore_generator, seed_everything
from ript.utils.trainer import RunSettings, Timer, TrainingRun, due, sum_by_name


def make_sampler(rl_cfg, seed: int, names: list[str], suite: str, info, k: int) -> InitialConditionSampler:
    pool = int(rl_cfg.ic_pool_size)
    limit = get_suite(suite).initial_conditions  # LIBERO: RL starts from the packaged init states (seed % 50)
    if limit is not None:
        pool = min(pool, limit)
    return InitialConditionSampler(names, rank_seed(seed, info.rank), pool, int(rl_cfg.skip_mastered_for),
                                   str(rl_cfg.task_weighting), k, floor=float(rl_cfg.task_weighting_floor),
                                   prior=bool(rl_cfg.task_weighting_prior))


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
    runner: Runner          # where the rollouts run (``rollout_environment``); closed with the loop
    refresh: WorldModelRefresh | None = None  # a world model refreshed on real episodes (environment.refresh_every)
    placement: Any = None   # where the rollouts run (``ript.rl.placement``): sends the weights before them
    compile_ahead: Any = None  # the update compiling in another process (``ript.rl.compile_ahead``), or None


def train_loop(run: RLRun) -> str:
    """The RL iterations, shared by every policy family, as named and timed phases: rollouts with dynamic
    sampling, the update (advantages, PPO on the learner's log-probs), metrics and log, the checkpoint (weights:
    ``learner.weights``; exact resume), the evaluation, and whether to stop."""
    rl = RLIterations(run)
    try:
        if rl.run.start == 0 and rl.eval_every:
            rl.evaluate(0)
        for it in range(rl.run.start, rl.iterations):
            timer = Timer()
            t0 = time.perf_counter()
            if rl.refresh is not None and rl.refresh.due(it):
                with timer("refresh"):  # real episodes join the world model's data; it trains on
                    rl.refresh.refresh(it, rl.policy, rl.runner)
            with timer("rollout_wait"):  # with rl.overlap: what of the rollouts the previous update did not hide
                batch, videos = rl.ahead.wait() if rl.ahead_running else rl.synced_rollouts(it)
            rl.ahead_running = rl.ahead is not None and it + 1 < rl.iterations
            if rl.ahead_running:
                rl.ahead.start(it + 1)
            compiling_ahead = run.compile_ahead is not None and it == rl.run.start
            if compiling_ahead:
                with timer("compile_wait"):  # its graphs and kernels, then found in the compiler's caches
                    run.compile_ahead.wait()
            with timer("train"):  # collating (and rescoring) the decisions too
                with timer("train_prepare"):  # collating (observations to the device), advantages
                    data, targets = update_batch(rl.learner, batch["kept"], rl.estimator, rl.cfg, rl.device, rl.info)
                stats = ppo_update(rl.learner, rl.opt, rl.sched, data, rl.cfg, rl.info, it, rl.device,
                                   rl.reference, rl.sharded, rl.anchor)
            if compiling_ahead:
                run.compile_ahead.report()
            done = time.perf_counter()
            timer.seconds["iteration"] = done - t0
            if rl.update_end is not None:  # since the previous update: its log, checkpoint and evaluation too
                timer.seconds["cycle"] = done - rl.update_end
            rl.update_end = done
            totals = rl.totals(batch, targets)
            rl.log(it + 1, rl.metrics(batch, stats, totals, timer), stats, totals, videos)
            rl.checkpoint(it + 1)
            spent = rl.budget_spent()
            if due(rl.eval_every, it + 1, rl.iterations) or (rl.eval_every and spent):
                rl.evaluate(it + 1)
            if rl.should_stop(it + 1, spent):
                break
    finally:
        rl.close()
    return str(run.run_dir)


class RLIterations:
    """What the RL loop's phases share: the learner and policy, optimiser, sampler, env runner, the run's
    bookkeeping (``TrainingRun``), the rollout record, and the env steps counted so far over all ranks."""

    def __init__(self, run: RLRun):
        cfg, info, learner, policy = run.cfg, run.info, run.learner, run.policy
        self.setup, self.cfg, self.info, self.device, self.learner, self.policy = run, cfg, info, run.device, \
            learner, policy
        self.names, self.iterations, self.eval_every = run.task_names, int(cfg.rl.iterations), int(cfg.eval.every)
        suite = str(run.metadata.get("suite"))
        self.estimator = build_estimator(cfg.rl)
        if self.estimator.uses_critic and learner.critic is None:
            raise RiptError(f"rl.advantage={cfg.rl.advantage} needs a critic, which {type(learner).__name__} does "
                            f"not have yet; use rloo or grpo")
        if cfg.rl.get("target_eval_shift") is not None and not learner.evaluation_shift_measured:
            raise RiptError(f"rl.target_eval_shift={cfg.rl.target_eval_shift}: the evaluation actions' shift is not "
                            f"measured for {type(learner).__name__} (a flow policy's ODE and OpenVLA-OFT's means "
                            f"are); use rl.target_kl")
        if flow_matching_coef(cfg.rl) > 0 and not learner.regresses_chunks:
            raise RiptError(f"rl.flow_matching_coef={cfg.rl.flow_matching_coef}: {type(learner).__name__} has no "
                            f"flow-matching loss (flow and π0 policies have); leave it at 0")
        self.sharded = bool(cfg.rl.get("fsdp"))
        self.anchor = demo_anchor(learner, run.metadata, cfg, run.device, self.sharded)
        check_same_start(learner, info)
        if self.sharded:  # rl.fsdp: before the optimiser, whose state then lives in shards too
            shard_learner(learner)
        self.opt, self.sched = make_optimizer(learner, cfg, run.device)
        self.sampling = GroupSampling.from_config(cfg.rl)
        self.sampler = make_sampler(cfg.rl, int(cfg.seed), self.names, suite, info, self.sampling.k)
        learner.attach(policy)  # the policy records what the update reads (with the critic's values, if any)
        self.run = TrainingRun(RunSettings("rl", run.run_dir, run.resume_from, cfg.keep_last,
                                           cfg.rl.stop_after_minutes, unit="iteration",
                                           compile_cache=cfg.get("compile_cache"),
                                           fewer_ranks=bool(cfg.get("resume_fewer_ranks"))), info, self.opt, self.sched,
                               ShardedState() if self.sharded else WholeState())
        self.reference = reference_state(learner, cfg)  # rl.kl_coef: the weights loaded from the checkpoint
        self.env_steps = 0  # env steps of the counted episodes, over all ranks
        self.update_end: float | None = None  # when the previous iteration's update ended (time/cycle)
        streams = self.run.resume(self.load_weights)
        if streams is not None:
            self.sampler.load_state_dict(streams["sampler"])
            restore_generator(policy.generator, streams["policy_rng"], run.resume_from, "policy_rng")
            self.env_steps = int(streams.get("env_steps", 0))
        self.logger = self.run.open_logger(to_dict(cfg))
        self.history = RolloutHistory(run.run_dir, self.run.start) if info.is_main else None
        self.runner = run.runner
        self.refresh = run.refresh
        if self.refresh is not None:  # the world model the run had got to
            self.refresh.resume(self.run.start, self.runner, int((streams or {}).get("real_env_steps", 0)))
        self.placement = run.placement
        self.ahead, self.ahead_running, self.resumed_rollout_weights = None, False, None
        # under torchrun, rollouts running ahead in a thread count their groups over a process group of their own,
        # beside the update's collectives on the default one
        self.rollout_group = ddist.side_group(info) if cfg.rl.get("overlap") else None
        if cfg.rl.get("overlap"):
            self.ahead = RolloutsAhead(self.rollouts, self.streams, self.placement.modules, self.placement.sync)
            if run.resume_from is not None:  # rollouts the checkpoint's run had started ahead: redone alike
                self.resumed_rollout_weights = rollout_weights(run.resume_from, self.placement.modules)

    def load_weights(self, ckpt: Path) -> None:
        weights = self.learner.weights
        check_and_load(weights, self.run.layout.load_weights(weights, load_weights(ckpt)), str(ckpt))
        if self.learner.critic is not None:
            load_critic(self.learner.critic, ckpt)

    def streams(self) -> dict:
        """The random streams the rollouts draw from, as a checkpoint keeps them."""
        return {"sampler": self.sampler.state_dict(), "policy_rng": self.policy.generator.get_state()}

    def synced_rollouts(self, it: int) -> tuple[dict, Path | None]:
        """The rollouts of iteration ``it`` after the rollout side has the weights to sample with."""
        if self.placement is not None:
            self.placement.sync(self.resumed_rollout_weights)
            self.resumed_rollout_weights = None
        return self.rollouts(it)

    def rollouts(self, it: int) -> tuple[dict, Path | None]:
        """Groups of rollouts until enough informative ones over all ranks (``collect_groups``); every
        ``rl.video_every`` iterations the first one is recorded."""
        self.sampler.start_iteration(it)
        inference_before = self.policy.inference_seconds
        every = int(self.cfg.rl.video_every)
        videos = self.setup.run_dir / "videos" / f"iter{it + 1:05d}" \
            if self.info.is_main and every and (it + 1) % every == 0 else None
        batch = collect_groups(self.runner, self.policy, self.sampler, self.sampling, self.info, videos,
                               self.rollout_group)
        batch["inference_seconds"] = self.policy.inference_seconds - inference_before  # the policy's planning time
        if batch["capped"] and self.info.is_main:
            log.warning("rl iteration %d: only %d of %d groups were informative after drawing %d (the most "
                        "rl.max_sampling_rounds allows); training on those", it + 1, int(batch["total_kept"]),
                        self.sampling.groups, batch["groups_drawn"])
        return batch, videos

    def totals(self, batch: dict, targets) -> dict[str, float]:
        """The iteration's counts over all ranks, by name (one collective); per task: ``episodes/<task>`` and
        ``successes/<task>``."""
        eps = batch["episodes"]
        sums = {"episodes": len(eps), "successes": sum(e["success"] for e in eps),
                "counted_env_steps": sum(e["length"] for e in eps),
                "nonzero_advantages": 0 if targets is None else float((targets.episode_advantages != 0).float().sum()),
                "inference_seconds": batch["inference_seconds"],
                "worker_busy_share": batch["worker_busy_share"],
                "driver_idle_share": batch["driver_idle_share"],
                "task_build_share": batch["task_build_share"],
                "env_steps": batch["env_steps"],
                "decisions": batch["decisions"], "decision_rounds": batch["decision_rounds"],
                "decision_rows": batch["decision_rows"],
                "returns": 0 if targets is None else len(targets.episode_returns),
                "returns_sum": 0 if targets is None else float(targets.episode_returns.sum())}
        for task in self.names:
            sums[f"episodes/{task}"] = sum(e["task"] == task for e in eps)
            sums[f"successes/{task}"] = sum(e["success"] for e in eps if e["task"] == task)
        return sum_by_name(sums, self.info)

    def metrics(self, batch: dict, stats: dict, totals: dict[str, float], timer: Timer) -> dict[str, float]:
        n, t_rollout = totals["episodes"], batch["seconds"]
        metrics = {
            "rollout/success_rate": totals["successes"] / max(1, n),
            "rollout/episodes": n,
            "rollout/groups_kept": batch["total_kept"],
            "rollout/kept_fraction": batch["total_kept"] * self.sampling.k / max(1, n),
            "rollout/nonzero_advantage_fraction": totals["nonzero_advantages"] / max(1, n),
            "rollout/groups_drawn": batch["groups_drawn"],
            "rollout/dropped_episodes": batch["dropped"],
            "rollout/cancelled_episodes": batch["cancelled"],
            "rollout/returns_mean": totals["returns_sum"] / max(1, totals["returns"]),  # kept episodes' rewards
            **metric_names(stats),
            "time/rollout": t_rollout, "time/train": timer.seconds["train"],
            "time/iteration": timer.seconds["iteration"],  # refresh, rollouts and update, as the run waited for them
            "time/rollout_wait": timer.seconds["rollout_wait"],  # rl.overlap: the rollouts' part not under the update
            # one iteration's wall time in a steady run (from the second iteration of a process on): what rl.overlap
            # hides under the previous update, log, checkpoint and evaluation is not counted twice
            **({"time/cycle": timer.seconds["cycle"]} if "cycle" in timer.seconds else {}),
            "time/train_prepare": timer.seconds["train_prepare"], "time/sync": batch["sync"] + stats["sync"],
            # of it, waiting for the other ranks' rollouts, and in the update's gradient averaging (ranks holding more
            # decisions than others keep them waiting there)
            "time/sync_rollout": batch["sync"], "time/sync_update": stats["sync"],
            "time/inference_share": totals["inference_seconds"] / max(1e-9, t_rollout * self.info.world_size),
            "time/worker_busy_share": totals["worker_busy_share"] / self.info.world_size,  # simulating, not waiting
            # the driver waiting for workers; 1 - this - inference_share: its own bookkeeping (frames, calls)
            "time/driver_idle_share": totals["driver_idle_share"] / self.info.world_size,
            "time/task_build_share": totals["task_build_share"] / self.info.world_size,  # part of worker_busy_share
            "time/env_steps_per_s": totals["env_steps"] / max(1e-9, t_rollout),  # cancelled episodes' steps too
            # a rank's batched decisions in a row, and the share of the rows they paid for that held a running env
            "time/decision_rounds": totals["decision_rounds"] / self.info.world_size,
            "time/slot_occupancy": totals["decisions"] / max(1, totals["decision_rows"]),
            **take_peak_memory_gib(self.device),  # this rank's, over the iteration
        }
        for task, (episodes, wins) in per_task(totals, self.names).items():  # over all ranks
            metrics[f"rollout/success/{task}"] = wins / episodes
        self.env_steps += int(totals["counted_env_steps"])
        metrics["rollout/env_steps_total"] = self.env_steps
        if self.refresh is not None:  # the simulator's share of every env step taken (the rest were imagined)
            real = self.refresh.real_env_steps
            metrics["rollout/real_env_steps_total"] = real
            metrics["rollout/real_env_step_share"] = real / max(1, real + self.env_steps)
            metrics["time/refresh"] = timer.seconds.get("refresh", 0.0)
        return metrics

    def log(self, iteration: int, metrics: dict, stats: dict, totals: dict[str, float], videos: Path | None) -> None:
        self.logger.log(metrics, iteration)
        if videos is not None:
            self.logger.log_videos(sorted(videos.glob("*.mp4")), "rollout/video", iteration)
        if self.history is not None:
            self.history.add(iteration, int(totals["episodes"]), int(totals["successes"]),
                             int(totals["counted_env_steps"]), per_task(totals, self.names),
                             {k: stats[k] for k in UPDATE_RECORD if k in stats})
        if not self.info.is_main:
            return
        log.info("rl iteration %d/%d: rollout success %.1f%%, %d groups kept (%d drawn, %d episodes, %d cancelled), "
                 "clip %.3f, kl %.4f, %.1f s rollout (%.0f env steps/s) + %.1f s train (%.1f s of it preparing the "
                 "batch)", iteration, self.iterations, 100 * metrics["rollout/success_rate"],
                 metrics["rollout/groups_kept"], metrics["rollout/groups_drawn"], int(totals["episodes"]),
                 metrics["rollout/cancelled_episodes"], stats["clip_fraction"], stats["approx_kl"],
                 metrics["time/rollout"], metrics["time/env_steps_per_s"], metrics["time/train"],
                 metrics["time/train_prepare"])
        if "eval_action_shift" in stats:
            log.info("rl iteration %d: the actions evaluation executes moved %.4f (root mean square, normalised "
                     "units)", iteration, stats["eval_action_shift"])
        log.info("rl iteration %d rollout time: policy %.0f%%, env workers busy %.0f%% (building tasks %.0f%%), "
                 "driver waiting on workers %.0f%%; %.0f decision rounds per process, %.0f%% of their rows used",
                 iteration, 100 * metrics["time/inference_share"], 100 * metrics["time/worker_busy_share"],
                 100 * metrics["time/task_build_share"], 100 * metrics["time/driver_idle_share"],
                 metrics["time/decision_rounds"], 100 * metrics["time/slot_occupancy"])
        if self.info.world_size > 1:
            log.info("rl iteration %d waiting for the other ranks: %.2f s after the rollouts, %.2f s in the update",
                     iteration, metrics["time/sync_rollout"], metrics["time/sync_update"])
        if self.learner.critic is not None:
            log.info("rl iteration %d critic: value loss %.4f, explained variance %.3f, returns %.3f", iteration,
                     stats["value_loss"], stats["explained_variance"], metrics["rollout/returns_mean"])

    def checkpoint(self, iteration: int) -> None:
        # with rollouts running ahead: the streams before they began, and their weights, to redo them on resume
        streams = {**(self.ahead.saved[0] if self.ahead_running else self.streams()), "env_steps": self.env_steps}
        if self.refresh is not None:
            streams["real_env_steps"] = self.refresh.real_env_steps

        def write_extra(folder: Path, whole: dict | None) -> None:
            write_learner_files(self.learner, folder, whole)
            if self.ahead_running:
                self.ahead.write(folder)

        self.run.save(iteration, self.learner.weights, self.setup.ckpt_config, streams, write_extra=write_extra)

    def evaluate(self, iteration: int) -> None:
        self.setup.evaluate(iteration, self.logger)
        ddist.barrier(self.info)

    def budget_spent(self) -> bool:
        """``rl.max_env_steps`` reached (the same total on every rank)."""
        budget = self.cfg.rl.max_env_steps
        return budget is not None and self.env_steps >= int(budget)

    def should_stop(self, iteration: int, spent: bool) -> bool:
        if spent:
            if self.info.is_main:
                log.info("rl: %d env steps after iteration %d reach rl.max_env_steps=%d; done", self.env_steps,
                         iteration, int(self.cfg.rl.max_env_steps))
            return True
        if self.run.out_of_time():
            self.run.stopped(iteration)
            return True
        return False

    def close(self) -> None:
        if self.ahead_running:  # a run stopped early: its rollouts ahead end before their runner closes
            try:
                self.ahead.wait()
            except Exception:  # noqa: BLE001  (the run is ending already; its checkpoint redoes them)
                pass
        self.runner.close()
        if self.refresh is not None:
            self.refresh.close()
        self.run.close()


def per_task(totals: dict[str, float], names: list[str]) -> dict[str, tuple[int, int]]:
    """Each task's (episodes, successes) over all ranks, for the tasks that ran."""
    return {task: (int(totals[f"episodes/{task}"]), int(totals[f"successes/{task}"])) for task in names
            if totals[f"episodes/{task}"]}
