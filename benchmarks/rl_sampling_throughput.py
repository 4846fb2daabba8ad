"""Dynamic sampling's throughput with one trained policy held fixed: RL's rollout phase (``collect_groups``, as
``ript rl`` builds it) for several iterations without updates. Per iteration: rollout seconds, groups drawn and
kept, episodes counted and cancelled, env steps, slot occupancy; overall: informative groups kept per rollout
minute and counted env steps per second. Episode lengths vary with the policy (successes end early), which is
what dynamic sampling's scheduling has to absorb, so the policy must be a trained one.

    MUJOCO_GL=egl python -m benchmarks.rl_sampling_throughput --checkpoint <policy run> --iterations 20 \
        --out result.json -- policy=flow device=cpu rl.groups_per_iteration=2 rl.rollouts_per_group=4 \
        rl.num_workers=2 workers.envs_per_worker=4
"""

from __future__ import annotations

import argparse
import json
import os
import time

from benchmarks.results_file import write_or_print
from ript.config import compose
from ript.envs.seeds import rank_seed
from ript.policies.families import family_for
from ript.rl.loop import init_rank, make_sampler
from ript.rl.placement import critic_settings
from ript.rl.rollout import GroupSampling, collect_groups, rollout_environment

PER_ITERATION = ("groups_drawn", "total_kept", "cancelled", "env_steps", "seconds", "worker_busy_share",
                 "slot_occupancy")


def measure(cfg, iterations: int, warmup: int) -> dict:
    family = family_for(cfg)
    device, info = init_rank(cfg)
    loaded = family.load(cfg, device, rank_seed(int(cfg.seed), info.rank), rl=True)
    learner = family.learner(loaded, cfg, device, critic_settings(cfg))
    learner.attach(loaded.policy)  # the policy records its decisions as RL's rollouts do
    runner = rollout_environment(cfg, info, loaded.metadata, loaded.task_names, loaded.policy, device)
    sampling = GroupSampling.from_config(cfg.rl)
    sampler = make_sampler(cfg.rl, int(cfg.seed), loaded.task_names, str(loaded.metadata.get("suite")), info,
                           sampling.k)
    rows = []
    try:
        for _ in range(warmup):  # workers started, tasks built, the policy compiled
            collect_groups(runner, loaded.policy, sampler, sampling, info)
        for it in range(iterations):
            sampler.start_iteration(it + 1)
            batch = collect_groups(runner, loaded.policy, sampler, sampling, info)
            row = {key: batch[key] for key in PER_ITERATION}
            row["counted_episodes"] = len(batch["episodes"])
            row["counted_env_steps"] = sum(e["length"] for e in batch["episodes"])
            row["success_rate"] = sum(e["success"] for e in batch["episodes"]) / max(1, len(batch["episodes"]))
            rows.append(row)
            print(json.dumps({"iteration": it + 1, **row}), flush=True)
    finally:
        runner.close()
    seconds = sum(r["seconds"] for r in rows)
    return {"iterations": rows, "rollout_seconds": seconds, "groups_kept": sum(r["total_kept"] for r in rows),
            "groups_kept_per_minute": 60 * sum(r["total_kept"] for r in rows) / seconds,
            "counted_env_steps_per_second": sum(r["counted_env_steps"] for r in rows) / seconds,
            "env_steps_per_second": sum(r["env_steps"] for r in rows) / seconds,
            "env_slots": runner.env_slots, "cores": os.cpu_count()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=1, help="iterations run first and not counted")
    ap.add_argument("--out")
    ap.add_argument("overrides", nargs="*", help="ript rl settings")
    args = ap.parse_args()
    cfg = compose("rl", [f"checkpoint={args.checkpoint}", *args.overrides])
    t = time.perf_counter()
    result = {"checkpoint": args.checkpoint, "overrides": args.overrides, **measure(cfg, args.iterations, args.warmup),
              "wall_seconds": time.perf_counter() - t}
    print(json.dumps({k: v for k, v in result.items() if k != "iterations"}, indent=1))
    if args.out is not None:
        write_or_print(result, args.out)  # written whole or not at all


if __name__ == "__main__":
    main()
