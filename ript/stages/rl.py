"""``ript rl``: RL fine-tuning of any policy family (``policy=skill_prior``, the default: a stage-1, finetune or
RL checkpoint; ``policy=openvla_oft`` / ``policy=openvla``: an official folder, with LoRA): leave-one-out PPO from
sparse success rewards (RIPT) with dynamic sampling, or PPO with a learned critic (GAE, sparse or dense rewards)
(``ript/rl/``: rollouts, the update, the loop). The checkpoint says which family it holds
(``ript.policies.families``); the family loads it and builds the policy, the learner and the checkpoints' record.

    ript rl checkpoint=runs/stage1 run_dir=runs/rl
    ript rl policy=openvla_oft checkpoint=<official folder> task=libero_spatial run_dir=runs/oft_rl
"""

from __future__ import annotations

from pathlib import Path

from ript.envs.seeds import rank_seed
from ript.errors import RiptError
from ript.evaluation.calibration import check_rewards_follow_simulator
from ript.evaluation.runner import make_runner
from ript.policies.families import family_for
from ript.rl import compile_ahead
from ript.rl.learners import check_fsdp
from ript.rl.loop import RLRun, init_rank, prepare_run, train_loop
from ript.rl.overlap import check_overlap
from ript.rl.placement import critic_settings, placement_kind
from ript.rl.refresh import WorldModelRefresh
from ript.stages import world_model, world_model_head
from ript.utils.seeding import shared_draws


def run(cfg) -> str:
    family = family_for(cfg)
    device, info = init_rank(cfg)  # first: the model is built on this rank's device
    check_overlap(cfg)
    check_fsdp(cfg)
    calibrated = check_rewards_follow_simulator(cfg.environment)  # the tasks RL keeps (None: all)
    kind = placement_kind(cfg)  # an unknown placement is one line before the model loads
    loaded = family.load(cfg, device, rank_seed(int(cfg.seed), info.rank), rl=True)
    trained_tasks = [t for t in loaded.task_names if calibrated is None or t in calibrated]
    if not trained_tasks:
        raise RiptError(f"environment.calibration={cfg.environment.calibration} keeps none of the policy's tasks "
                        f"({', '.join(loaded.task_names)})")
    placement = kind(cfg=cfg, info=info, loaded=loaded, device=device)  # where the rank's rollouts run
    try:  # a run that cannot start leaves no run folder and no workers behind
        refresh = WorldModelRefresh(cfg, Path(cfg.run_dir), loaded.metadata, loaded.task_names, device,
                                    info.world_size, world_model.run, world_model_head.run) \
            if cfg.environment.get("refresh_every") else None
        return _train(cfg, family, loaded, info, device, placement, refresh, trained_tasks)
    finally:
        placement.runner.close()


def _train(cfg, family, loaded, info, device: str, placement, refresh: WorldModelRefresh | None,
           trained_tasks: list[str]) -> str:
    run_dir, resume_from = prepare_run(cfg, info)
    with shared_draws(int(cfg.seed), device):  # its fresh weights alike on every rank
        learner = family.learner(loaded, cfg, device, critic_settings(cfg))
    placement.attach(learner)
    ckpt_config = family.rl_checkpoint(loaded, cfg)
    names = loaded.task_names
    eval_runner = make_runner(loaded.metadata, names, cfg.eval, cfg.workers) if info.is_main and cfg.eval.every \
        else None
    evaluate = family.rl_evaluation(loaded, learner, cfg, device, eval_runner, run_dir) if eval_runner else None

    def maybe_evaluate(iteration: int, logger) -> None:
        if evaluate is not None:  # rank 0 alone evaluates
            evaluate(iteration, logger)

    cache_loaded = resume_from is not None or bool(cfg.get("compile_cache"))
    ahead = compile_ahead.CompileAhead(cfg, device) \
        if compile_ahead.wanted(cfg, learner.compiles_update, info.world_size, cache_loaded) else None
    try:
        return train_loop(RLRun(cfg, info, device, learner, loaded.policy, trained_tasks, loaded.metadata, ckpt_config,
                                run_dir, resume_from, maybe_evaluate, placement.runner, refresh, placement, ahead))
    finally:
        if ahead is not None:
            ahead.close()
        if eval_runner is not None:
            eval_runner.close()
