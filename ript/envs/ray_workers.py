"""Env workers as Ray actors (``workers.backend=ray``): the same pool as ``ript/envs/workers.py`` (one call per
worker in flight, an answer or a failure per call, a dead or silent worker replaced and its episodes run again or
dropped), but each worker is an actor that Ray places on any node of a cluster, so the simulators can run on
CPU-only machines while the policy stays on the GPU host. Frames come back inside the answers (Ray's object
store), as shared memory reaches no other node.

``workers.ray_address``: null starts a Ray instance on this host (its CPUs, at least one per worker); ``auto`` or
``host:port`` joins a cluster started with ``ray start --head`` (docs/distributed.md). Ray is an optional extra:
``pip install 'ript[ray]'``.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import Any

from ript.envs.workers import Pending, allow_replacement, due_calls, raise_worker_error
from ript.errors import RiptError
from ript.registry import WORKER_POOLS
from ript.utils.logging import log

# the rendering settings env workers read; a Ray worker process gets them from the driver's environment
RENDER_ENV = ("MUJOCO_GL", "PYOPENGL_PLATFORM", "MUJOCO_EGL_DEVICE_ID", "EGL_DEVICE_ID")


def import_ray():
    try:
        import ray
    except ImportError as e:
        raise RiptError("workers.backend=ray needs Ray: pip install 'ript[ray]'") from e
    return ray


class EnvActor:
    """One env worker inside a Ray actor: builds its envs once, then answers (method, args) calls."""

    def __init__(self, make_env: Callable[[], Any]):
        self.env = make_env()

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def call(self, name: str, args: tuple) -> tuple[Any, float]:
        t0 = time.perf_counter()
        return getattr(self.env, name)(*args), time.perf_counter() - t0  # with the seconds it was busy

    def close(self) -> None:
        self.env.close()


def check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """A ``host:port`` with nothing listening is one line now: Ray itself retries such an address for minutes."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise RiptError(f"workers.ray_address={address}: expected auto or host:port (the head's `ray start` address)")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise RiptError(f"workers.ray_address={address}: no Ray head answers there ({e.strerror or e}); start one "
                        f"with `ray start --head --port={port}`") from None


def connect(ray, address: str | None, cpus: int, busy_gpus: tuple[int, ...] = ()) -> None:
    """Join the Ray cluster at ``address`` or start one on this host, once per process (a second pool of the
    same process, e.g. an evaluation's beside RL's, uses the same). A cluster started here hands out the host's
    GPUs other than ``busy_gpus`` (those this process computes on)."""
    if ray.is_initialized():
        return
    if address not in (None, "auto"):
        check_reachable(address)
    env_vars = {k: os.environ[k] for k in RENDER_ENV if k in os.environ}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if address is None and busy_gpus:  # Ray counts the GPUs it may hand out from the variable, at start
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in free_gpus(busy_gpus))
    try:
        # null: a Ray instance of this job's own ("local"), even where another runs on this host
        ray.init(address=address or "local", num_cpus=None if address else max(cpus, os.cpu_count() or 1),
                 include_dashboard=False, log_to_driver=False, configure_logging=False,
                 runtime_env={"env_vars": env_vars} if env_vars else None)
    except (ConnectionError, ValueError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RiptError(f"workers.ray_address={address}: cannot join a Ray cluster there ({first})") from None
    finally:
        if visible is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible


def free_gpus(busy: tuple[int, ...]) -> list[int]:
    """This process's GPUs, as the host numbers them, other than ``busy``."""
    import torch

    from ript.envs.gl import physical_gpu

    return [g for g in (physical_gpu(i) for i in range(torch.cuda.device_count())) if g not in busy]


@WORKER_POOLS.register("ray")
class RayWorkerPool:
    """Env workers as Ray actors, spread over the cluster's nodes; the interface of ``WorkerPool``."""

    shares_memory = False  # frames travel inside the answers
    render_gpus = None     # where the actors render is their nodes' business: not known here

    def __init__(self, env_fns: list[Callable[[], Any]], timeout_s: float, max_restarts: int,
                 address: str | None = None, render_gpus: list[int] | None = None):
        del render_gpus  # each node's actors render where that node's EGL chooses
        self.ray = ray = import_ray()
        connect(ray, address, len(env_fns))
        self.address = address
        self.env_fns, self.timeout_s, self.max_restarts = env_fns, float(timeout_s), int(max_restarts)
        self.restarts, self.busy_s = 0, 0.0
        # one CPU each, spread over the nodes; no restarts by Ray: a replaced worker is this pool's decision
        self.actor_class = ray.remote(num_cpus=1, max_restarts=0, scheduling_strategy="SPREAD")(EnvActor)
        self.actors: list[Any] = [self.actor_class.remote(fn) for fn in env_fns]
        try:
            self.nodes = self._placed(list(range(len(env_fns))))
        except BaseException:
            self._kill_all()
            raise
        log.info("env workers: %d Ray actors on %d node(s)", len(env_fns), len(set(self.nodes)))

    def __len__(self) -> int:
        return len(self.env_fns)

    def _placed(self, workers: list[int]) -> list[str]:
        """Wait until these workers' actors run and have built their envs; their nodes. An actor Ray cannot
        place (no free CPU in the cluster) or whose envs fail to build is one line, not a hang."""
        ray = self.ray
        refs = [self.actors[i].node.remote() for i in workers]
        try:
            return ray.get(refs, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            free = ray.available_resources().get("CPU", 0)
            raise RiptError(f"workers.backend=ray: {len(workers)} env worker(s) not started within "
                            f"workers.timeout_s={self.timeout_s:g} s; the Ray cluster has {free:g} CPUs free "
                            f"(each worker takes one)") from None
        except ray.exceptions.RayActorError as e:
            first = str(e).strip().splitlines()[0]
            raise RiptError(f"workers.backend=ray: an env worker failed to start: {first}") from None

    def _replace(self, i: int, why: str) -> None:
        self.ray.kill(self.actors[i], no_restart=True)
        self.restarts += 1
        allow_replacement(i, why, self.restarts, self.max_restarts)
        self.actors[i] = self.actor_class.remote(self.env_fns[i])
        self.nodes[i] = self._placed([i])[0]

    def send(self, i: int, name: str, args: tuple) -> Pending:
        pending = Pending(name, time.monotonic() + self.timeout_s)
        pending.waiting[self.actors[i].call.remote(name, args)] = i
        return pending

    def ready(self, calls: dict[int, Pending]) -> list[int]:
        """Blocks until some of these calls can be received without waiting (answered, failed, or past their
        deadline); their keys."""
        now = time.monotonic()
        due = due_calls(calls, now)
        if due:
            return due
        owner = {ref: w for w, c in calls.items() for ref in c.waiting}
        refs = list(owner)
        wait_s = max(0.0, min(c.deadline for c in calls.values()) - now)
        self.ray.wait(refs, num_returns=1, timeout=wait_s)
        answered, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0)
        now = time.monotonic()
        return sorted({owner[r] for r in answered} | {w for w, c in calls.items() if c.deadline <= now})

    def receive(self, pending: Pending) -> tuple[list[Any], list[int]]:
        """The answer of a ``send``: (per-worker results, the workers that failed and were replaced)."""
        ray = self.ray
        results: list[Any] = [None] * len(self)
        failed, silent, error = list(pending.failed), [], None
        for ref, i in pending.waiting.items():
            try:
                results[i], busy = ray.get(ref, timeout=max(0.0, pending.deadline - time.monotonic()))
                self.busy_s += busy
            except ray.exceptions.RayTaskError as e:  # the env raised: the run's error, not the worker's
                error = error or (e.cause, str(e))
            except ray.exceptions.GetTimeoutError:
                silent.append(i)
            except ray.exceptions.RayActorError:
                failed.append(i)
        pending.waiting.clear()
        if error is not None:
            raise_worker_error(*error)
        for i in sorted(failed):
            self._replace(i, f"died during {pending.name}")
        for i in sorted(silent):
            self._replace(i, f"did not answer {pending.name} within workers.timeout_s={self.timeout_s:g} s")
        return results, sorted(failed + silent)

    def _kill_all(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor, no_restart=True)

    def close(self) -> None:
        ray = self.ray
        try:
            ray.get([a.close.remote() for a in self.actors], timeout=10)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            pass  # a worker already dead or stuck: killed below
        self._kill_all()
