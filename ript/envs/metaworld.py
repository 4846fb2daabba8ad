"""MetaWorld v3 adapter: one task per env, seeded object layouts, multi-camera rendering.

Observations use canonical keys: ``<camera>_rgb`` (H, W, 3) uint8 upright images,
``robot_states`` (hand xyz + gripper opening) and ``env_state`` (MetaWorld's 39-d vector).
MetaWorld is imported lazily so the rest of ript works without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ript.envs import gl  # noqa: F401  (before MuJoCo is imported: its GL backend)
from ript.errors import RiptError

if TYPE_CHECKING:
    from ript.envs.rendering import SharedGLContext

ROBOT_STATE_DIM = 4
ENV_STATE_DIM = 39
ACTION_DIM = 4

# One instruction per MetaWorld v3 task, written for this project.
INSTRUCTIONS: dict[str, str] = {
    "assembly-v3": "pick up the ring nut and place it over the peg",
    "basketball-v3": "pick up the ball and drop it through the hoop",
    "bin-picking-v3": "move the block from one bin into the other bin",
    "box-close-v3": "pick up the lid and close the box with it",
    "button-press-topdown-v3": "press the button from the top",
    "button-press-topdown-wall-v3": "press the button from the top past the wall",
    "button-press-v3": "press the button on the front of the box",
    "button-press-wall-v3": "press the button on the box behind the wall",
    "coffee-button-v3": "press the button on the coffee machine",
    "coffee-pull-v3": "pull the mug away from the coffee machine",
    "coffee-push-v3": "push the mug under the coffee machine",
    "dial-turn-v3": "turn the dial a half turn",
    "disassemble-v3": "lift the ring nut off the peg",
    "door-close-v3": "swing the door closed",
    "door-lock-v3": "turn the lock on the door to lock it",
    "door-open-v3": "pull the door open by its handle",
    "door-unlock-v3": "turn the lock on the door to unlock it",
    "drawer-close-v3": "push the drawer closed",
    "drawer-open-v3": "pull the drawer open",
    "faucet-close-v3": "turn the faucet handle to close it",
    "faucet-open-v3": "turn the faucet handle to open it",
    "hammer-v3": "pick up the hammer and drive the nail into the wall",
    "hand-insert-v3": "slide the block into the hole in the table",
    "handle-press-side-v3": "press the handle down from the side",
    "handle-press-v3": "press the handle down",
    "handle-pull-side-v3": "pull the handle up from the side",
    "handle-pull-v3": "pull the handle up",
    "lever-pull-v3": "pull the lever up",
    "peg-insert-side-v3": "pick up the peg and insert it sideways into the hole",
    "peg-unplug-side-v3": "pull the peg out of the hole sideways",
    "pick-out-of-hole-v3": "pick the peg out of the hole and lift it to the goal",
    "pick-place-v3": "pick up the puck and place it at the goal",
    "pick-place-wall-v3": "pick up the puck, lift it over the wall and place it at the goal",
    "plate-slide-back-side-v3": "slide the plate sideways back out of the cabinet",
    "plate-slide-back-v3": "slide the plate back out of the cabinet",
    "plate-slide-side-v3": "slide the plate sideways into the cabinet",
    "plate-slide-v3": "slide the plate into the cabinet",
    "push-back-v3": "push the puck backwards to the goal",
    "push-v3": "push the puck to the goal",
    "push-wall-v3": "push the puck around the wall to the goal",
    "reach-v3": "move the gripper to the goal position",
    "reach-wall-v3": "move the gripper over the wall to the goal position",
    "shelf-place-v3": "pick up the block and place it on the shelf",
    "soccer-v3": "push the ball into the goal",
    "stick-pull-v3": "grasp the stick and use it to pull the box",
    "stick-push-v3": "grasp the stick and use it to push the box",
    "sweep-into-v3": "sweep the puck into the hole",
    "sweep-v3": "sweep the puck off the edge of the table",
    "window-close-v3": "slide the window closed",
    "window-open-v3": "slide the window open",
}


def benchmark_tasks(benchmark: str, split: str = "train") -> list[str]:
    """Task names of a MetaWorld benchmark: ML45 (train/test split), ML10, MT10, MT50."""
    from metaworld import env_dict

    key = benchmark.upper()
    if key == "MT50":
        return list(env_dict.MT50_V3)
    if key == "MT10":
        return list(env_dict.MT10_V3)
    if key in ("ML45", "ML10"):
        if split not in ("train", "test"):
            raise RiptError(f"task.split={split!r}: expected 'train' or 'test'")
        return list(getattr(env_dict, f"{key}_V3")[split])
    raise RiptError(f"task.benchmark={benchmark!r} is unknown; use ML45, ML10, MT10 or MT50")


def check_task_names(names: list[str]) -> None:
    unknown = [n for n in names if n not in INSTRUCTIONS]
    if unknown:
        raise RiptError(
            f"unknown MetaWorld task {unknown[0]!r} (in task.task_names); known names look like 'pick-place-v3'"
        )


@dataclass(frozen=True)
class RenderSettings:
    """How images are made. Stored in dataset metadata so evaluation renders the same way."""

    cameras: tuple[str, ...] = ("corner", "gripperPOV")
    image_size: int = 128
    # "high": MuJoCo's defaults; "low": no shadows, reflections or multisampling (3-9x faster on CPU).
    quality: str = "low"
    flip_cameras: tuple[str, ...] = ("corner", "corner2", "corner3", "corner4")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RenderSettings:
        return cls(
            cameras=tuple(d["cameras"]),
            image_size=int(d["image_size"]),
            quality=str(d["quality"]),
            flip_cameras=tuple(d.get("flip_cameras", cls.flip_cameras)),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "cameras": list(self.cameras),
            "image_size": self.image_size,
            "quality": self.quality,
            "flip_cameras": list(self.flip_cameras),
        }


class MetaWorldTask:
    """One MetaWorld v3 task with seeded layouts: ``reset(seed)`` draws object/goal positions from the seed."""

    def __init__(self, task_name: str, render: RenderSettings | None, max_episode_steps: int = 500,
                 shared_gl: SharedGLContext | None = None):
        check_task_names([task_name])
        import mujoco
        from metaworld.env_dict import ALL_V3_ENVIRONMENTS

        self.task_name = task_name
        self.render_settings = render
        self.max_episode_steps = max_episode_steps
        env = ALL_V3_ENVIRONMENTS[task_name]()
        # Same steps as metaworld's own task sampling, minus building all 45 envs (35 s).
        env._set_task_called = True
        env._set_task_inner()
        # The scripted experts read the goal from the state vector, so keep it observable (as MT50 does).
        env._partially_observable = False
        env.__dict__.pop("sawyer_observation_space", None)  # cached bounds depend on observability
        env._freeze_rand_vec = False
        env.seeded_rand_vec = True
        env.max_path_length = max_episode_steps
        self.env = env
        self._mujoco = mujoco
        self._renderer = None
        if render is not None:
            if render.quality not in ("high", "low"):
                raise RiptError(f"render.quality={render.quality!r}: expected 'high' or 'low'")
            known = {env.model.camera(i).name for i in range(env.model.ncam)}
            missing = [c for c in render.cameras if c not in known]
            if missing:
                raise RiptError(f"render.cameras: unknown camera {missing[0]!r}; MetaWorld has {sorted(known)}")
            if render.quality == "low":
                env.model.vis.quality.offsamples = 0
            from ript.envs.rendering import SideBySideRenderer  # imports mujoco: after MUJOCO_GL is set

            self._renderer = SideBySideRenderer(env.model, render.image_size, render.cameras, render.quality == "low",
                                                shared_gl)
        self._last_raw = None
        self.done = True
        self.success = False

    @property
    def instruction(self) -> str:
        return INSTRUCTIONS[self.task_name]

    def render_images(self) -> dict[str, np.ndarray]:
        if self._renderer is None:
            return {}
        images = {}
        for cam, img in zip(self.render_settings.cameras, self._renderer.render(self.env.data)):
            if cam in self.render_settings.flip_cameras:
                img = np.ascontiguousarray(img[::-1])  # these cameras render upside down
            images[f"{cam}_rgb"] = img
        return images

    def _obs(self, raw: np.ndarray, render: bool) -> dict[str, np.ndarray]:
        obs = {
            "robot_states": raw[:ROBOT_STATE_DIM].astype(np.float32),
            "env_state": raw.astype(np.float32),
        }
        if render:
            obs.update(self.render_images())
        return obs

    def sim_state(self) -> np.ndarray:
        m = self._mujoco
        spec = m.mjtState.mjSTATE_INTEGRATION
        state = np.empty(m.mj_stateSize(self.env.model, spec))
        m.mj_getState(self.env.model, self.env.data, state, spec)
        return state

    def reset(self, seed: int, render: bool = True) -> dict[str, np.ndarray]:
        self.env.seed(int(seed))
        raw, _ = self.env.reset()
        self._last_raw = raw
        self.done = False
        self.success = False
        return self._obs(raw, render)

    def step(self, action: np.ndarray, render: bool = True) -> tuple[dict[str, np.ndarray], float, bool, dict]:
        """Steps once; after the episode ended (success or horizon) it is a no-op that repeats the last obs."""
        if self.done:
            return self._obs(self._last_raw, render), 0.0, True, {"success": self.success}
        action = np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0)
        raw, reward, _, truncated, info = self.env.step(action)
        self._last_raw = raw
        self.success = bool(info["success"])
        self.done = self.success or truncated or self.env.curr_path_length >= self.max_episode_steps
        return self._obs(raw, render), float(reward), self.done, {"success": self.success}

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        self.env.close()


def expert_policy(task_name: str):
    """MetaWorld's scripted expert for a task (``get_action(env_state) -> action``)."""
    from metaworld.policies import ENV_POLICY_MAP

    check_task_names([task_name])
    return ENV_POLICY_MAP[task_name]()
