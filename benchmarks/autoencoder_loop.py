"""How far the stage-0 action autoencoder alone limits a LIBERO policy: a perfect prior in closed loop.

    MUJOCO_GL=egl python -m benchmarks.autoencoder_loop <stage-0 or stage-1 checkpoint> --task <name> \
        [--suite libero_object] [--episodes 6] [--modes expert,raw,ae] [--horizon 8] [--phases]

Every ``--horizon`` steps the noise-free scripted expert plans its next ``chunk`` actions in the simulator
(state saved and restored around the look-ahead); ``raw`` executes the plan's first ``horizon`` actions,
``ae`` first encodes the plan to tokens and decodes it with the checkpoint's autoencoder, as a policy whose
prior predicted the expert's own tokens would. ``expert`` steps the expert every step. Episodes start from
demonstration layouts (``demo_layout_seed``). ``--phases`` prints each episode's expert phases (``alo``: align,
gripper open; ``deC``: descend, gripper closed ...), which shows where the decoded chunks go wrong.
"""

from __future__ import annotations

import argparse
import copy
from itertools import groupby

import numpy as np
import torch


def snapshot(task) -> tuple:
    inner = task.env.env  # robosuite's env inside LIBERO's wrapper keeps its own step count
    return (task.env.get_sim_state().copy(), task.steps, task.done, task.success, task._raw, inner.timestep,
            inner.done, [r.gripper.current_action.copy() for r in task.env.robots])


def restore(task, snap: tuple) -> None:
    state, steps, done, success, raw, timestep, inner_done, grip = snap
    task.env.regenerate_obs_from_state(state)
    task._raw, task.steps, task.done, task.success = raw, steps, done, success
    task.env.env.timestep, task.env.env.done = timestep, inner_done
    for robot, g in zip(task.env.robots, grip):
        robot.gripper.current_action = g.copy()


def lookahead(task, expert, chunk: int) -> np.ndarray:
    """The expert's next ``chunk`` actions (the last repeated past the episode's end); the task is left as it was."""
    snap, planner, plan = snapshot(task), copy.deepcopy(expert), []
    for _ in range(chunk):
        plan.append(planner.get_action(task))
        if task.done:
            break
        task.step(plan[-1], render=False)
    restore(task, snap)
    plan = np.stack(plan)
    return np.concatenate([plan, np.repeat(plan[-1:], chunk - len(plan), 0)])


@torch.no_grad()
def encoded(autoencoder, chunks: np.ndarray) -> np.ndarray:
    """The stage-0 tokens of a batch of action chunks (B, chunk, action_dim)."""
    norm = autoencoder.action_normalizer
    return autoencoder.encode(norm.normalize(torch.tensor(chunks, dtype=torch.float32)))[1].numpy()


@torch.no_grad()
def decoded_tokens(autoencoder, tokens: np.ndarray) -> np.ndarray:
    """The action chunks a batch of stage-0 tokens decodes to."""
    return autoencoder.action_normalizer.unnormalize(autoencoder.decode_indices(torch.tensor(tokens)).float()).numpy()


def decoded(autoencoder, plan: np.ndarray) -> np.ndarray:
    return decoded_tokens(autoencoder, encoded(autoencoder, plan[None]))[0]


def episode(task, seed: int, mode: str, autoencoder, horizon: int) -> tuple[bool, list[str]]:
    from ript.experts.libero.goals import make_expert

    task.reset(seed, render=False)
    expert, phases = make_expert(task), []
    while not task.done:
        if mode == "expert":
            task.step(expert.get_action(task), render=False)
            phases.append(expert.phase[:2])
            continue
        plan = lookahead(task, expert, autoencoder.chunk_size)
        actions = plan if mode == "raw" else decoded(autoencoder, plan)
        for a in actions[:horizon]:
            expert.get_action(task)  # keeps the expert's phase in step with the state
            phases.append(expert.phase[:2] + ("C" if a[6] > 0 else "o"))
            task.step(a, render=False)
            if task.done:
                break
    return task.success, phases


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--task", required=True)
    p.add_argument("--suite", default="libero_object")
    p.add_argument("--episodes", type=int, default=6)
    p.add_argument("--modes", default="expert,raw,ae")
    p.add_argument("--horizon", type=int, default=8)
    p.add_argument("--phases", action="store_true")
    a = p.parse_args()

    from ript.envs.libero import LiberoTask
    from ript.envs.seeds import demo_layout_seed
    from ript.model_loader import load_model

    model, ckpt = load_model(a.checkpoint)
    autoencoder = (model if ckpt["stage"] == "stage0" else model.autoencoder).eval()  # later stages hold stage 0
    task = LiberoTask(a.suite, a.task, None)
    for mode in a.modes.split(","):
        wins = []
        for e in range(a.episodes):
            success, phases = episode(task, demo_layout_seed(0, e, 0), mode, autoencoder, a.horizon)
            wins.append(int(success))
            if a.phases:
                print(f"  {mode} episode {e}: {[(k, len(list(g))) for k, g in groupby(phases)][:16]}")
        print(f"{a.task} {mode:6s} horizon {a.horizon}: {np.mean(wins):.0%} {wins}", flush=True)
    task.close()


if __name__ == "__main__":
    main()
