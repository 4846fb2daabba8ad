"""Env worker processes that a runner drives, each one replaceable and answering on its own (``workers.backend
=processes``, the default; ``ript/envs/ray_workers.py`` holds the same pool as Ray actors).

gymnasium's ``AsyncVectorEnv`` ends the whole vector env when one worker dies and waits forever on one that
hangs. Here each worker gets its own call, answers through its own pipe, and one that dies or stays silent
past ``timeout_s`` is killed and started afresh; ``receive`` reports which workers failed so the runner can run
their episodes again (evaluation) or drop them (RL). Past ``max_restarts`` replacements the run fails with one
line. Workers are spawned (a forked child inherits a GL context and hangs) and die with their parent.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from ript.envs.gl import use_render_gpu, worker_render_gpus
from ript.errors import RiptError
from ript.registry import WORKER_POOLS
from ript.utils.logging import log
from ript.utils.processes import die_with_parent, stacks_on_signal

_CLOSE = "__close__"


def _serve(make_env: Callable[[], Any], conn: Connection, render_gpu: int | None) -> None:
    """A worker's loop: build the env (rendering on the host's GPU ``render_gpu``), then answer (method, args)
    calls until told to close."""
    die_with_parent()
    stacks_on_signal()
    use_render_gpu(render_gpu)
    env = make_env()
    try:
        while True:
            try:
                name, args = conn.recv()
            except (EOFError, KeyboardInterrupt):
                return
            if name == _CLOSE:
                return
            try:
                t0 = time.perf_counter()
                value = getattr(env, name)(*args)
                conn.send(("ok", (value, time.perf_counter() - t0)))  # with the seconds the worker was busy
            except Exception as e:  # sent to the parent, which raises it
                conn.send(("error", (e, traceback.format_exc())))
    finally:
        env.close()


@dataclass
class Pending:
    """A call sent to one worker and not yet answered."""

    name: str
    deadline: float
    waiting: dict = field(default_factory=dict)  # what answers (a pipe, a Ray object) -> worker index
    failed: list = field(default_factory=list)


def allow_replacement(i: int, why: str, restarts: int, max_restarts: int) -> None:
    """Worker i is to be replaced, the run's ``restarts``-th replacement: logged, or past ``max_restarts`` the
    run's end in one line."""
    if restarts > max_restarts:
        raise RiptError(f"env worker {i} {why}, and {restarts - 1} workers were already replaced "
                        f"(workers.max_restarts={max_restarts}); raise it or workers.timeout_s, or check "
                        f"memory (dmesg) if workers are being killed")
    log.warning("env worker %d %s; replacing it (%d of workers.max_restarts=%d)", i, why, restarts, max_restarts)


def due_calls(calls: dict[int, Pending], now: float) -> list[int]:
    """The calls that can be received without waiting on an answer: never sent, or past their deadline."""
    return [w for w, c in calls.items() if not c.waiting or c.deadline <= now]


def raise_worker_error(exc: BaseException, trace: str) -> None:
    """An env's own exception, raised in the runner: a ript error as it is (one line), any other with the
    worker's traceback."""
    if isinstance(exc, RiptError):
        raise exc
    raise RuntimeError(f"env worker raised {type(exc).__name__}: {exc}\n{trace}")


@WORKER_POOLS.register("processes")
class WorkerPool:
    """Env workers as spawned processes of this host, each answering through its own pipe."""

    shares_memory = True  # frames come back through shared-memory blocks (``SharedFrames``)
    render_gpus: list[int | None]  # the GPU each worker renders on, as the host numbers them (None: EGL's default)

    def __init__(self, env_fns: list[Callable[[], Any]], timeout_s: float, max_restarts: int,
                 address: str | None = None, render_gpus: list[int] | None = None):
        del address  # a Ray setting
        self.env_fns = env_fns
        self.timeout_s = float(timeout_s)
        self.max_restarts = int(max_restarts)
        self.restarts = 0
        self.busy_s = 0.0  # seconds workers spent inside calls, summed over workers (utilisation = busy / wall)
        self.ctx = mp.get_context("spawn")
        self.render_gpus = worker_render_gpus(len(env_fns), render_gpus)
        self.procs: list[Any] = [None] * len(env_fns)
        self.conns: list[Connection | None] = [None] * len(env_fns)
        for i in range(len(env_fns)):
            self._start(i)

    def __len__(self) -> int:
        return len(self.env_fns)

    def _start(self, i: int) -> None:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_serve, args=(self.env_fns[i], child, self.render_gpus[i]), daemon=True,
                                name=f"ript-env-{i}")
        proc.start()
        child.close()
        self.procs[i], self.conns[i] = proc, parent

    def _replace(self, i: int, why: str) -> None:
        proc = self.procs[i]
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        self.conns[i].close()
        self.restarts += 1
        allow_replacement(i, why, self.restarts, self.max_restarts)
        self._start(i)

    def send(self, i: int, name: str, args: tuple) -> Pending:
        """Start ``name(*args)`` on worker i without waiting (other workers' calls may be in flight); ``receive``
        collects it."""
        pending = Pending(name, time.monotonic() + self.timeout_s)
        try:
            self.conns[i].send((name, args))
            pending.waiting[self.conns[i]] = i
        except (BrokenPipeError, EOFError, OSError):
            pending.failed.append(i)
        return pending

    def ready(self, calls: dict[int, Pending]) -> list[int]:
        """Blocks until some of these calls (one worker's each) can be received without waiting: answered,
        failed to send, or past their deadline. Returns their keys."""
        now = time.monotonic()
        due = due_calls(calls, now)
        if due:
            return due
        owner = {conn: w for w, c in calls.items() for conn in c.waiting}
        answered = wait(list(owner), timeout=max(0.0, min(c.deadline for c in calls.values()) - now))
        now = time.monotonic()
        return sorted({owner[conn] for conn in answered} | {w for w, c in calls.items() if c.deadline <= now})

    def receive(self, pending: Pending) -> tuple[list[Any], list[int]]:
        """The answer of a ``send``: (per-worker results, the workers that failed and were replaced)."""
        results: list[Any] = [None] * len(self)
        failed, waiting, name = pending.failed, pending.waiting, pending.name
        error = None
        while waiting:
            ready = wait(list(waiting), timeout=max(0.0, pending.deadline - time.monotonic()))
            if not ready:
                break
            for conn in ready:
                i = waiting.pop(conn)
                try:
                    status, value = conn.recv()
                except (EOFError, OSError):
                    failed.append(i)
                    continue
                if status == "ok":
                    results[i], busy = value
                    self.busy_s += busy
                elif error is None:
                    error = value
        if error is not None:
            raise_worker_error(*error)
        for i in sorted(failed):
            code = self.procs[i].exitcode
            self._replace(i, f"died (exit code {code}) during {name}")
        for i in sorted(waiting.values()):
            self._replace(i, f"did not answer {name} within workers.timeout_s={self.timeout_s:g} s")
            failed.append(i)
        return results, sorted(failed)

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send((_CLOSE, ()))
            except (BrokenPipeError, EOFError, OSError):
                pass
        for proc, conn in zip(self.procs, self.conns):
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
            conn.close()
