"""What runs inside an env worker process: a few simulator envs, driven a decision at a time.

Kept free of torch so a spawned worker starts in well under a second (importing torch in each of 16 workers
took longer than a whole evaluation's simulation). A worker hosts ``envs_per_worker`` envs; one call starts
or advances several of them, so the pipe is crossed once per worker per decision round, not once per env.
Rendered images go back through a shared-memory block the runner allocates per worker (``SharedFrames``);
only small arrays are pickled. Frames that do not fit the block (a recorded episode renders every step) are
sent inline.
"""

from __future__ import annotations

import functools
import hashlib
import math
import time
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from ript.envs import ray_workers, workers  # noqa: F401  (register the worker backends; Ray is imported on use)
from ript.envs.compiled_scenes import CompiledScenes
from ript.envs.gl import host_render_gpus
from ript.envs.suites import get_suite
from ript.registry import WORKER_POOLS
from ript.utils.processes import available_memory_bytes, ranks_on_this_host


@dataclass(frozen=True)
class EpisodeSpec:
    task_name: str
    seed: int
    index: int  # episode number within its task (RL: within the round, so K rollouts of one layout differ)
    record: bool = False  # a video of it is kept
    keep: bool = False    # every step's observation and action are kept (the episode as a demonstration file)

    @property
    def key(self) -> int:
        """A stable 63-bit name of the episode, which seeds its policy-noise stream (``policies/base.py``)."""
        digest = hashlib.blake2b(f"{self.task_name}|{self.seed}|{self.index}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") >> 1


@dataclass(frozen=True)
class FrameLayout:
    """The shape of one worker's shared frame block: (envs, frames per env, cameras, H, W, 3) uint8."""

    envs: int
    frames: int
    image_keys: tuple[str, ...]
    image_size: int

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.envs, self.frames, len(self.image_keys), self.image_size, self.image_size, 3)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape)


class SharedFrames:
    """A worker's shared-memory block of rendered frames. The runner creates (and finally unlinks) one per
    worker; the worker attaches by name, writes a decision's frames into its env's rows, and sends their row
    numbers instead of the pixels. A replaced worker attaches to the same block."""

    def __init__(self, layout: FrameLayout, name: str | None = None):
        self.layout = layout
        self.owner = name is None
        # spawned workers share the runner's resource tracker, so a worker attaching registers nothing new, and
        # the block outlives a worker that dies; the runner unlinks it (the tracker does if the runner dies)
        self.shm = shared_memory.SharedMemory(name=name, create=self.owner, size=max(1, layout.nbytes))
        self.array = np.ndarray(layout.shape, dtype=np.uint8, buffer=self.shm.buf)

    @property
    def name(self) -> str:
        return self.shm.name

    def put(self, env: int, frame: int, obs: dict[str, np.ndarray]) -> dict[str, Any]:
        """Write ``obs``'s images into row (env, frame) if they fit; returns obs with each written image
        replaced by the row's address (an int tuple), so the pipe carries only the small arrays."""
        if frame >= self.layout.frames:
            return obs
        out = dict(obs)
        for c, key in enumerate(self.layout.image_keys):
            image = obs.get(key)
            if image is not None and image.shape == self.array.shape[3:]:
                self.array[env, frame, c] = image
                out[key] = (env, frame, c)
        return out

    def get(self, obs: dict[str, Any]) -> dict[str, Any]:
        """The runner's side of ``put``: addresses replaced by copies of the frames (the next call of the
        worker overwrites its rows, and policies keep the arrays they observe)."""
        return {k: self.array[v].copy() if isinstance(v, tuple) else v for k, v in obs.items()}

    def close(self) -> None:
        self.array = None
        self.shm.close()
        if self.owner:
            self.shm.unlink()


class InlineFrames:
    """Frames that travel inside the answers (a worker on another node of a Ray cluster shares no memory)."""

    name = None

    def put(self, env: int, frame: int, obs: dict[str, np.ndarray]) -> dict[str, Any]:
        return obs

    def get(self, obs: dict[str, Any]) -> dict[str, Any]:
        return obs

    def close(self) -> None:
        pass


class TaskEnv:
    """One env slot of a worker: builds simulator tasks on demand and keeps them for reuse."""

    def __init__(self, suite: str, render: dict, max_episode_steps: int, shared_gl: Any = None,
                 task_limit: int = 1, compiled: CompiledScenes | None = None):
        self.render_cfg, self.max_steps, self.shared_gl = render, max_episode_steps, shared_gl
        self.compiled = compiled  # the run's compiled scenes (Suite.make_task)
        self.tasks: dict[str, Any] = {}  # by scene (Suite.scene_of), in order of last use
        self.current = None
        self.suite_entry = get_suite(suite)
        self.cache_limit = task_limit  # built tasks kept, the least recently used closed first

    def begin(self, spec: EpisodeSpec) -> tuple[dict[str, np.ndarray], float]:
        """Start the episode; returns its first observation and the seconds spent building its task (0 when
        the slot had it built)."""
        t0 = time.perf_counter()
        scene = self.suite_entry.scene_of(spec.task_name)
        task = self.tasks.pop(scene, None)
        if task is None:
            while len(self.tasks) >= self.cache_limit:
                self.tasks.pop(next(iter(self.tasks))).close()  # least recently used
            task = self.suite_entry.make_task(spec.task_name, self.render_cfg, self.max_steps, self.shared_gl,
                                              self.compiled)
        elif task.task_name != spec.task_name:
            self.suite_entry.switch_task(task, spec.task_name)  # another task of the scene: no build
        self.tasks[scene] = self.current = task
        self.steps = 0
        built_s = time.perf_counter() - t0
        return self.current.reset(spec.seed, render=True), built_s

    def advance_chunk(self, chunk: np.ndarray, keep_last: int, record: bool):
        """Run the whole action chunk (stopping at the episode's end). Renders only the last ``keep_last``
        steps (the policy's next frame stack) and the last ``keep_last`` before the time limit (a critic's view
        of where a cut episode ended), or every step of a recorded episode; returns ([(step, obs), ...]
        rendered, steps taken, the chunk's summed reward, done, success)."""
        rendered, done, success, n, reward = [], False, False, len(chunk), 0.0
        for t, action in enumerate(chunk):
            self.steps += 1
            render = record or t >= n - keep_last or self.steps > self.max_steps - keep_last
            obs, r, done, info = self.current.step(action, render=render)
            success, reward = info["success"], reward + r
            if render:
                rendered.append((t, obs))
            if done:
                break
        return rendered, t + 1, reward, done, success

    def close(self) -> None:
        for task in self.tasks.values():
            task.close()
        self.tasks.clear()


class WorkerEnvs:
    """The object a worker serves: ``envs_per_worker`` env slots and their shared frame block (None: frames go
    back inside the answers)."""

    def __init__(self, suite: str, render: dict, max_episode_steps: int, layout: FrameLayout,
                 frames_name: str | None, task_limit: int = 1, compiled: CompiledScenes | None = None):
        from ript.envs.rendering import SharedGLContext  # imports MuJoCo: in the worker, after its GL backend is set

        self.shared_gl = SharedGLContext()  # every task the worker builds renders in one context (rendering.py)
        self.envs = [TaskEnv(suite, render, max_episode_steps, self.shared_gl, task_limit, compiled)
                     for _ in range(layout.envs)]
        self.frames = InlineFrames() if frames_name is None else SharedFrames(layout, frames_name)

    def begin(self, starts: list[tuple[int, EpisodeSpec]]) -> list[tuple[int, dict, float, list[str]]]:
        """Start an episode in each listed slot: [(slot, spec)] -> [(slot, first observation, build seconds,
        the scenes the slot now keeps built)]."""
        out = []
        for j, spec in starts:
            obs, built_s = self.envs[j].begin(spec)
            out.append((j, self.frames.put(j, 0, obs), built_s, list(self.envs[j].tasks)))
        return out

    def advance(self, moves: list[tuple[int, np.ndarray, int, bool]]) -> list[tuple[int, list, int, bool, bool]]:
        """Run each listed slot's chunk: [(slot, chunk, keep_last, record)] -> [(slot, rendered, taken, reward,
        done, success)], the rendered frames' images in the shared block where they fit."""
        out = []
        for j, chunk, keep_last, record in moves:
            rendered, taken, reward, done, success = self.envs[j].advance_chunk(chunk, keep_last, record)
            out.append((j, [(t, self.frames.put(j, r, obs)) for r, (t, obs) in enumerate(rendered)], taken, reward,
                        done, success))
        return out

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.shared_gl.close()  # after the tasks that drew in it
        self.frames.close()


@dataclass(frozen=True)
class PoolSettings:
    """How env workers run (``configs/workers``): a worker silent for ``timeout_s`` or dead is replaced, up to
    ``max_restarts`` times a run; ``backend`` processes (this host) or ray (``address``: a cluster's nodes);
    ``render_gpus``: the host's GPUs the processes render on (None: chosen, ``ript.envs.gl.worker_render_gpus``);
    ``tasks_per_slot``: the built tasks each env slot keeps ("auto": as many as a share of the host's memory
    holds, ``slot_task_limit``), which ``host_sets`` sets of env workers share (None: the torchrun ranks here)."""
    timeout_s: float = 600.0
    max_restarts: int = 3
    backend: str = "processes"
    address: str | None = None
    render_gpus: tuple[int, ...] | None = None
    tasks_per_slot: int | str = "auto"
    host_sets: int | None = None

    @classmethod
    def from_config(cls, workers_cfg) -> PoolSettings:
        gpus = workers_cfg.get("render_gpus")
        per_slot, sets = workers_cfg.get("tasks_per_slot", "auto"), workers_cfg.get("host_sets")
        return cls(float(workers_cfg.timeout_s), int(workers_cfg.max_restarts), str(workers_cfg.backend),
                   workers_cfg.get("ray_address"), None if gpus is None else tuple(int(g) for g in gpus),
                   per_slot if per_slot == "auto" else int(per_slot), None if sets is None else int(sets))


# the share of the host's available memory the env slots' built tasks may fill; the rest is the driving process's
# (the policy, RL's records and update) and the simulators' own stepping
TASK_MEMORY_SHARE = 0.5


def slot_task_limit(setting: int | str, task_mib: int, slots: int, available_bytes: int, processes: int = 1) -> int:
    """How many built tasks an env slot keeps: ``setting`` if a number, else ("auto") as many as fit in
    ``TASK_MEMORY_SHARE`` of ``available_bytes`` split over every slot of the ``processes`` that start workers on
    this host (at least one). Rebuilding costs seconds a task (LIBERO) where an unbounded cache would grow with
    every task a long run meets (ML45's 45 in each of 64 slots: ~250 GB)."""
    if setting != "auto":
        return int(setting)
    budget = TASK_MEMORY_SHARE * available_bytes / max(1, processes)
    return max(1, int(budget // (max(1, slots) * task_mib * 2**20)))


class WorkerSet:
    """The runner's handle on its env workers: the replaceable workers and, where they share this host's memory,
    one shared frame block each."""

    def __init__(self, suite: str, render: dict, max_episode_steps: int, num_workers: int, envs_per_worker: int,
                 frames_per_env: int, pool: PoolSettings):
        layout = FrameLayout(envs_per_worker, frames_per_env, tuple(f"{c}_rgb" for c in render["cameras"]),
                             int(render["image_size"]))
        pool_class = WORKER_POOLS.get(pool.backend)
        self.envs_per_worker = envs_per_worker
        self.scene_of = get_suite(suite).scene_of  # what the slots report as built (WorkerEnvs.begin)
        renders_on_gpu = bool(pool.render_gpus or host_render_gpus())
        self.task_limit = slot_task_limit(pool.tasks_per_slot, get_suite(suite).built_task_mib(renders_on_gpu),
                                          num_workers * envs_per_worker, available_memory_bytes(),
                                          pool.host_sets or ranks_on_this_host())
        self.frames = [SharedFrames(layout) if pool_class.shares_memory else InlineFrames()
                       for _ in range(num_workers)]
        # workers on this host share one folder of compiled scenes (workers elsewhere compile their own)
        self.compiled = (CompiledScenes.create() if pool_class.shares_memory and get_suite(suite).compiles_scenes
                         else None)
        fns = [functools.partial(WorkerEnvs, suite, render, max_episode_steps, layout, f.name, self.task_limit,
                                 self.compiled) for f in self.frames]
        try:
            self.pool = pool_class(fns, pool.timeout_s, pool.max_restarts, pool.address,
                                   None if pool.render_gpus is None else list(pool.render_gpus))
        except BaseException:
            self._free_host_resources()
            raise

    def _free_host_resources(self) -> None:
        for f in self.frames:
            f.close()
        self.frames = []
        if self.compiled is not None:
            self.compiled.remove()
            self.compiled = None

    def close(self) -> None:
        try:
            self.pool.close()
        finally:
            self._free_host_resources()
