"""A flow policy's denoise-step count K: success in the simulator and the time of one decision, for each K.

    python -m benchmarks.flow_denoise_steps --checkpoint <flow run> [--steps 1 2 4 8 16] [--episodes 20]
                                            [--batch 64] [--out <file.json>] [--overrides key=value ...]

Each K is the same checkpoint evaluated with ``policy.denoise_steps=K`` (the ODE, as ``ript eval`` runs it, the
same seeds for every K); the decision's time is the median of 20 ``plan()`` calls on ``--batch`` envs holding a
real first frame of the first task, after 3 untimed ones (on a GPU, synchronised; CUDA graphs as in evaluation).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchmarks.profile_rollout import isolated_plan_ms
from benchmarks.results_file import write_or_print
from ript.config import compose
from ript.envs.suites import get_suite
from ript.policies.families import family_for
from ript.stages import evaluate
from ript.utils.device import resolve_device


def first_frame(metadata: dict, task_name: str) -> dict:
    """The observation a worker sends at the start of the task's first episode."""
    env_args = metadata["env_args"]
    task = get_suite(metadata["suite"]).make_task(task_name, env_args["render"], int(env_args["max_episode_steps"]))
    try:
        return task.reset(0, render=True)
    finally:
        task.close()


def one_k(checkpoint: str, k: int, episodes: int, batch: int, overrides: list[str], out_dir: Path) -> dict:
    cfg = compose("eval", [f"checkpoint={checkpoint}", "policy=flow", f"policy.denoise_steps={k}",
                           f"episodes_per_task={episodes}", f"out_dir={out_dir}", "n_videos=0", *overrides])
    results = evaluate.run(cfg)
    loaded = family_for(cfg).load(cfg, resolve_device(cfg.device), int(cfg.seed), rl=False)
    task_name = loaded.task_names[0]
    ms = isolated_plan_ms(loaded.policy, task_name, first_frame(loaded.metadata, task_name), batch)
    return {"denoise_steps": k, "success_rate": results["success_rate"], "per_task": results["per_task"],
            "episodes": len(results["episodes"]), "decision_ms": ms, "batch": batch}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--steps", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--episodes", type=int, default=20, help="per task")
    ap.add_argument("--batch", type=int, default=64, help="envs planned together in the timed decision")
    ap.add_argument("--overrides", nargs="*", default=[], help="more `ript eval` settings")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in args.steps:
            rows.append(one_k(args.checkpoint, k, args.episodes, args.batch, args.overrides, Path(tmp) / f"k{k}"))
            print(f"K={k:>3}  success {100 * rows[-1]['success_rate']:5.1f}%  decision "
                  f"{rows[-1]['decision_ms']:7.2f} ms (batch {args.batch})", flush=True)
    write_or_print({"checkpoint": args.checkpoint, "episodes_per_task": args.episodes, "rows": rows}, args.out)


if __name__ == "__main__":
    main()
