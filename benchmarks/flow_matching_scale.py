"""How large `rl.flow_matching_coef` has to be to matter: the gradient norm of PPO's clipped objective against that
of the advantage-weighted flow-matching term, on decisions a flow checkpoint records in its own suite.

    python -m benchmarks.flow_matching_scale --checkpoint <flow run> [--tasks 2] [--episodes 2] [--steps 120]
        [--noise-level 0.5] [--out <file.json>]

Each task's episodes start from its packaged init states (RL's seeds) and are sampled as RL samples them (Flow-SDE,
one stochastic step per chunk). Every episode gets one advantage drawn from a standard normal, shared by its
decisions as RLOO shares a rollout's; both terms are taken at ratio 1, where PPO's first minibatch is. With
Adam the update follows the sum's direction, so the ratio of the two norms is roughly the coefficient at which the
flow-matching term pulls as hard as PPO.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.results_file import write_or_print
from ript.envs.runner import EnvRunner, RunnerOptions
from ript.envs.seeds import rl_layout_seed
from ript.envs.worker_env import EpisodeSpec
from ript.model_loader import load_model
from ript.models.flow_denoise import Denoising
from ript.policies.flow_policy import FlowPolicy
from ript.rl.flow_learner import FlowLearner
from ript.rl.objective import ppo_loss


def recorded_episodes(policy: FlowPolicy, model, metadata: dict, tasks: list[str], episodes: int, steps: int,
                      workers: int) -> list[list[dict]]:
    runner = EnvRunner(RunnerOptions(metadata["suite"], model.task_names, metadata["env_args"]["render"], steps, 1,
                                     num_workers=workers, envs_per_worker=2))
    specs = [EpisodeSpec(task, rl_layout_seed(i), i) for task in tasks for i in range(episodes)]
    try:
        out = runner.run(policy, specs=specs)
    finally:
        runner.close()
    return [e["decisions"] for e in out["episodes"]]


def gradient_norm(params: list[torch.nn.Parameter], loss: torch.Tensor) -> float:
    for p in params:
        p.grad = None
    loss.backward()
    return float(torch.sqrt(sum((p.grad.float() ** 2).sum() for p in params if p.grad is not None)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--tasks", type=int, default=2, help="the checkpoint's first N tasks")
    ap.add_argument("--episodes", type=int, default=2, help="per task")
    ap.add_argument("--steps", type=int, default=120, help="episode length")
    ap.add_argument("--noise-level", type=float, default=0.5)
    ap.add_argument("--denoise-steps", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    model, ckpt = load_model(args.checkpoint)
    denoising = Denoising(steps=args.denoise_steps, method="flow_sde", noise_level=args.noise_level)
    horizon = int(ckpt["metadata"]["sampling"]["action_horizon"])
    policy = FlowPolicy(model, denoising, horizon, "cpu", seed=args.seed, deterministic=False)
    learner = FlowLearner(model, denoising, horizon, True, "element")
    learner.attach(policy)
    tasks = list(model.task_names)[: args.tasks]
    episodes = recorded_episodes(policy, model, ckpt["metadata"], tasks, args.episodes, args.steps, args.workers)
    data = learner.collate([d for e in episodes for d in e], "cpu")
    per_episode = torch.randn(len(episodes), generator=torch.Generator().manual_seed(args.seed))
    advantages = torch.cat([per_episode[i].expand(len(e)) for i, e in enumerate(episodes)])
    idx = torch.arange(len(advantages))
    ppo, _ = ppo_loss(learner.score(data, idx).log_probs.float(), data["old_log_probs"], advantages, 0.1, 0.1)
    ppo_norm = gradient_norm(learner.params, ppo)
    errors = learner.chunk_regression(data, idx).float()
    flow_matching = (advantages.clamp(min=0) * errors).mean()
    fm_norm = gradient_norm(learner.params, flow_matching)
    results = {"checkpoint": args.checkpoint, "tasks": tasks, "episodes": len(episodes), "decisions": len(idx),
               "noise_level": args.noise_level, "denoise_steps": args.denoise_steps,
               "ppo_grad_norm": ppo_norm, "flow_matching_grad_norm": fm_norm,
               "coefficient_for_equal_norms": ppo_norm / fm_norm,
               "flow_matching_loss": float(flow_matching.detach()), "mean_chunk_error": float(errors.mean().detach())}
    write_or_print(results, args.out)


if __name__ == "__main__":
    main()
