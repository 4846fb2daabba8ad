"""One registry entry per simulator suite: everything the rest of ript needs to know about a suite, so no
code outside ``ript/envs`` compares suite names.

A suite knows its task list, how to build a task, the instructions, the standard evaluation protocol (episodes
per task), how much host memory a built task holds, how many distinct initial conditions a task has, and the
scripted-expert family that makes its demonstrations (a name in ``ript.registry.EXPERTS``). Simulators are imported
only when a task is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ript.envs.libero import LIBERO_INIT_STATES, SUITE_HORIZONS, task_scene
from ript.errors import RiptError


@dataclass(frozen=True)
class Suite:
    name: str
    horizon: int                      # the suite's official episode length (task.max_episode_steps: null)
    standard_episodes: int            # episodes per task of the suite's standard evaluation protocol
    task_mib: int                     # host memory one built task holds (sizes each env slot's cache)
    envs_per_worker: int              # env slots per worker process when workers.envs_per_worker is auto
    initial_conditions: int | None    # distinct initial conditions per task (None: one per layout seed)
    control_hz: int                   # env steps per simulated second (a dataset's fps)
    shaped_reward: bool               # the env's step reward is shaped (dense RL rewards), not only success
    expert: str                       # the scripted-expert family of its demos (ript.registry.EXPERTS)
    compiles_scenes: bool = False     # a build compiles a costly scene: env workers keep compiled ones on disk
    gpu_task_mib: int | None = None   # task_mib where it renders on a GPU, its buffers there (None: task_mib)

    def built_task_mib(self, renders_on_gpu: bool) -> int:
        """The host memory one built task holds, rendering on a GPU or in software."""
        return (self.gpu_task_mib or self.task_mib) if renders_on_gpu else self.task_mib

    def task_names(self, task_cfg) -> list[str]:
        """``task.task_names`` if given (checked), else the suite's (or benchmark split's) task list."""
        raise NotImplementedError

    def make_task(self, task_name: str, render: dict, max_episode_steps: int, shared_gl: Any = None,
                  compiled: Any = None) -> Any:
        """A task's env, its ``task_name`` the task it runs (``switch_task`` may change it); ``shared_gl``: a
        ``ript.envs.rendering.SharedGLContext`` its renderer may draw in (its owner, e.g. an env worker, frees it
        after the task closes; a suite that renders otherwise ignores it); ``compiled``: a
        ``ript.envs.compiled_scenes.CompiledScenes`` its scene may be loaded from instead of compiled (a suite
        whose builds compile nothing costly ignores it)."""
        raise NotImplementedError

    def instructions(self, names: list[str]) -> dict[str, str]:
        raise NotImplementedError

    def scene_of(self, task_name: str) -> str:
        """The key of the built scene a task runs in: tasks of one scene share a built task (``switch_task``),
        so an env slot that has one built starts the others without building. By default each task is its own."""
        return task_name

    def switch_task(self, task: Any, task_name: str) -> None:
        """Make a built task serve ``task_name``, a task of its scene (``scene_of``)."""
        raise RiptError(f"suite {self.name}: task {task_name!r} shares no built scene with another task")


class MetaWorldSuite(Suite):
    def task_names(self, task_cfg) -> list[str]:
        from ript.envs.metaworld import benchmark_tasks, check_task_names

        names = list(task_cfg.task_names) if task_cfg.get("task_names") else benchmark_tasks(
            task_cfg.benchmark, task_cfg.split)
        check_task_names(names)
        return names

    def make_task(self, task_name: str, render: dict, max_episode_steps: int, shared_gl: Any = None,
                  compiled: Any = None) -> Any:
        from ript.envs.metaworld import MetaWorldTask, RenderSettings

        # a whole MetaWorld build takes ~0.3 s (docs/speed.md): compiled is not used
        return MetaWorldTask(task_name, RenderSettings.from_dict(render), max_episode_steps, shared_gl)

    def instructions(self, names: list[str]) -> dict[str, str]:
        from ript.envs.metaworld import INSTRUCTIONS

        return {n: INSTRUCTIONS[n] for n in names}



class LiberoSuite(Suite):
    def task_names(self, task_cfg) -> list[str]:
        from ript.envs import libero

        if task_cfg.get("task_names"):
            names = list(task_cfg.task_names)
            libero.check_task_names(self.name, names)
            return names
        return libero.suite_tasks(self.name)

    def make_task(self, task_name: str, render: dict, max_episode_steps: int, shared_gl: Any = None,
                  compiled: Any = None) -> Any:
        from ript.envs.libero import LiberoRender, LiberoTask

        # robosuite renders through contexts of its own: shared_gl is not used
        return LiberoTask(self.name, task_name, LiberoRender.from_dict(render), max_episode_steps, compiled)

    def instructions(self, names: list[str]) -> dict[str, str]:
        from ript.envs.libero import LiberoTask

        return {n: LiberoTask.describe(self.name, n)["instruction"] for n in names}

    def scene_of(self, task_name: str) -> str:
        return task_scene(self.name, task_name)

    def switch_task(self, task: Any, task_name: str) -> None:
        task.switch_to(task_name)



# MetaWorld: 4 envs per worker ran rollouts fastest on the 16-core H100 host (8,200 env steps/s against 7,100
# with 2 and 5,600-6,700 with 1); a built task kept holds 138-153 MiB of host memory rendering in software (a
# 2-core CPU host) and 71-76 MiB rendering on an H200 (benchmarks/task_build_speed.py). LIBERO: 50
# packaged init states per task define the standard protocol and RL's initial conditions; a scene holds ~0.7 GiB
# once reset, so one env per worker.
SUITES: dict[str, Suite] = {
    "metaworld": MetaWorldSuite("metaworld", horizon=500, standard_episodes=20, task_mib=150, gpu_task_mib=90,
                                envs_per_worker=4, initial_conditions=None,
                                control_hz=80, shaped_reward=True, expert="metaworld"),
    **{name: LiberoSuite(name, horizon=horizon, standard_episodes=LIBERO_INIT_STATES, task_mib=800,
                         envs_per_worker=1, initial_conditions=LIBERO_INIT_STATES, control_hz=20,
                         shaped_reward=False, expert="libero", compiles_scenes=True)
       for name, horizon in SUITE_HORIZONS.items()},
}


def task_horizon(task_cfg) -> int:
    """A task config's episode length: ``task.max_episode_steps``, or its suite's official horizon."""
    return int(task_cfg.max_episode_steps or get_suite(str(task_cfg.suite)).horizon)


def get_suite(name: str) -> Suite:
    try:
        return SUITES[name]
    except KeyError:
        raise RiptError(f"unknown simulator suite {name!r} (task.suite); available: {', '.join(SUITES)}") from None
