"""MetaWorld's episode source for ``ript collect`` (``ript.experts.base.EpisodeSource``, registered as
``metaworld``): ``metaworld.policies`` experts with Gaussian noise."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from ript.data.hdf5 import EXPERT_ACTIONS, Demo
from ript.envs.metaworld import INSTRUCTIONS, MetaWorldTask, RenderSettings, expert_policy
from ript.registry import EXPERTS


def open_task(task_name: str, suite: str, render: dict, max_episode_steps: int, compiled=None) -> MetaWorldTask:
    del compiled  # MetaWorld compiles no scenes (Suite.compiles_scenes)
    # MetaWorld's experts warn on every call that their gains saturate; the env clips actions anyway.
    warnings.filterwarnings("ignore", message=r"Constant\(s\) may be too high")
    task = MetaWorldTask(task_name, RenderSettings.from_dict(render), max_episode_steps)
    task.expert = expert_policy(task_name)
    return task


def run_episode(task: MetaWorldTask, layout_seed: int, noise_rng: np.random.Generator, noise: float) -> Demo:
    obs = task.reset(layout_seed)
    frames: dict[str, list] = {k: [] for k in obs}
    actions, expert_actions, rewards, states = [], [], [], []
    while not task.done:
        for k, v in obs.items():
            frames[k].append(v)
        states.append(task.sim_state())
        action = task.expert.get_action(obs["env_state"].astype(np.float64))
        expert_actions.append(np.clip(action, -1.0, 1.0).astype(np.float32))  # what the env would apply of it
        action = np.clip(action + noise_rng.normal(0.0, noise, size=action.shape), -1.0, 1.0).astype(np.float32)
        obs, reward, _, _ = task.step(action)
        actions.append(action)
        rewards.append(reward)
    dones = np.zeros(len(actions), dtype=np.uint8)
    dones[-1] = 1
    return Demo(
        actions=np.stack(actions),
        obs={k: np.stack(v) for k, v in frames.items()},
        states=np.stack(states),
        rewards=np.asarray(rewards, dtype=np.float32),
        dones=dones,
        attrs={"success": bool(task.success), "layout_seed": layout_seed},
        extra={EXPERT_ACTIONS: np.stack(expert_actions)},
    )


def file_attrs(suite: str, task_name: str, render: dict, max_episode_steps: int) -> dict[str, Any]:
    return {
        "suite": "metaworld",
        "task_name": task_name,
        "instruction": INSTRUCTIONS[task_name],
        "env_args": {"suite": "metaworld", "task_name": task_name, "max_episode_steps": max_episode_steps,
                     "render": render},
        "problem_info": {"language_instruction": INSTRUCTIONS[task_name]},
    }


@EXPERTS.register("metaworld")
class MetaWorldEpisodes:
    """The functions above as one ``EpisodeSource``."""

    open_task = staticmethod(open_task)
    run_episode = staticmethod(run_episode)
    file_attrs = staticmethod(file_attrs)
