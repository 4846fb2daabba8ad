"""LIBERO's episode source for ``ript collect`` (``ript.experts.base.EpisodeSource``, registered as ``libero``): the
privileged-state planners of ``ript.experts.libero`` (``goals.make_expert``), written in the layout of LIBERO's own
``create_dataset.py`` so that official files and ours read alike.

    data.attrs: problem_info, bddl_file_name, env_args (JSON), plus suite/task_name/instruction
    data/demo_i/{actions, states, robot_states, rewards, dones}
    data/demo_i/expert_actions (ript's own: the expert's command before the noise; ``data.action_key``)
    data/demo_i/obs/{agentview_rgb, eye_in_hand_rgb (upside down, as robosuite renders and LIBERO stores),
                     joint_states, gripper_states, ee_states, ee_pos, ee_ori}
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ript.data.hdf5 import EXPERT_ACTIONS, Demo
from ript.envs.compiled_scenes import CompiledScenes
from ript.envs.libero import LiberoRender, LiberoTask
from ript.experts.libero.goals import make_expert
from ript.registry import EXPERTS


def open_task(task_name: str, suite: str, render: dict, max_episode_steps: int,
              compiled: CompiledScenes | None = None) -> LiberoTask:
    return LiberoTask(suite, task_name, LiberoRender.from_dict(render), max_episode_steps, compiled)


def run_episode(task: LiberoTask, layout_seed: int, noise_rng: np.random.Generator, noise: float,
                render: bool = True) -> Demo:
    """One expert episode from a fresh placement drawn from ``layout_seed`` (< 10**9: never an evaluation
    init state). Noise is added to the arm's motion, not to the gripper command."""
    task.reset(layout_seed, render=False)
    expert = make_expert(task)
    steps: dict[str, list] = {k: [] for k in ("actions", EXPERT_ACTIONS, "states", "robot_states", "rewards",
                                              "joint_states", "gripper_states", "ee_states", "ee_pos", "ee_ori")}
    images: dict[str, list] = {}
    while not task.done:
        raw = task.privileged()
        if render:
            for k, v in task.raw_images().items():
                images.setdefault(k, []).append(v)
        steps["states"].append(task.sim_state())
        pos, quat, grip = raw["robot0_eef_pos"], raw["robot0_eef_quat"], raw["robot0_gripper_qpos"]
        steps["robot_states"].append(np.concatenate([grip, pos, quat]))
        obs = task._obs(raw, render=False)
        for k in ("joint_states", "gripper_states", "ee_states"):
            steps[k].append(obs[k])
        steps["ee_pos"].append(obs["ee_states"][:3])
        steps["ee_ori"].append(obs["ee_states"][3:])
        action = expert.get_action(task)
        steps[EXPERT_ACTIONS].append(np.clip(action, -1.0, 1.0).astype(np.float32))  # the controller clips too
        action[:6] = np.clip(action[:6] + noise_rng.normal(0.0, noise, size=6), -1.0, 1.0)
        _, reward, _, _ = task.step(action, render=False)
        steps["actions"].append(action.astype(np.float32))
        steps["rewards"].append(reward)
    dones = np.zeros(len(steps["actions"]), dtype=np.uint8)
    dones[-1] = 1
    obs_keys = ("joint_states", "gripper_states", "ee_states", "ee_pos", "ee_ori")
    obs = {k: np.stack(steps[k]).astype(np.float32) for k in obs_keys}
    obs.update({k: np.stack(v) for k, v in images.items()})
    return Demo(
        actions=np.stack(steps["actions"]),
        obs=obs,
        states=np.stack(steps["states"]),
        rewards=np.asarray(steps["rewards"], dtype=np.uint8),
        dones=dones,
        attrs={"success": bool(task.success), "layout_seed": layout_seed},
        extra={"robot_states": np.stack(steps["robot_states"]).astype(np.float32),
               EXPERT_ACTIONS: np.stack(steps[EXPERT_ACTIONS])},
    )


def file_attrs(suite: str, task_name: str, render: dict, max_episode_steps: int) -> dict[str, Any]:
    task = LiberoTask.describe(suite, task_name)
    size = int(render["image_size"])
    problem_info = {"problem_name": task["problem_name"], "domain_name": "robosuite",
                    "language_instruction": task["instruction"]}
    env_args = {
        "type": 1,  # robomimic's EnvType.ROBOSUITE_TYPE
        "env_name": task["problem_name"],
        "problem_name": task["problem_name"],
        "bddl_file": task["bddl_file"],
        "env_kwargs": {"bddl_file_name": task["bddl_file"], "robots": ["Panda"], "controller": "OSC_POSE",
                       "camera_names": ["agentview", "robot0_eye_in_hand"], "camera_heights": size,
                       "camera_widths": size, "control_freq": 20},
        # what ript's runner needs to rebuild the same observations
        "suite": suite, "task_name": task_name, "max_episode_steps": max_episode_steps, "render": render,
    }
    return {
        "suite": suite,
        "task_name": task_name,
        "instruction": task["instruction"],
        "problem_info": problem_info,
        "bddl_file_name": task["bddl_file"],
        "env_args": env_args,
        "macros_image_convention": "opengl",  # upside down, as in the official datasets
    }


@EXPERTS.register("libero")
class LiberoEpisodes:
    """The functions above as one ``EpisodeSource``."""

    open_task = staticmethod(open_task)
    run_episode = staticmethod(run_episode)
    file_attrs = staticmethod(file_attrs)
