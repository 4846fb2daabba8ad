"""Child-process hygiene shared by the collection pool and the env workers."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies, so a ``kill -9`` of a run leaves no orphaned
    workers (elsewhere this is a no-op; the workers then exit on their pipe's end of file)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def usable_cores() -> int:
    """The cores this process may run on (its affinity; a container's CPU limit can be lower still)."""
    with contextlib.suppress(AttributeError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@contextlib.contextmanager
def driver_threads(busy_workers: int, threads: int | None = None):
    """While ``busy_workers`` simulator processes keep cores busy, the driving process's torch ops use only the
    cores left over (at least one), or ``threads``. With torch's default of one OpenMP thread per core, a parallel
    host-side op of a policy call (it indexed the batch's images) waited for cores the simulators held, and the
    spinning threads slowed the simulators: 25 ms per LIBERO policy call inside the runner against 5-7 ms alone
    (``benchmarks/profile_rollout.py``, 16 workers on 16 cores)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads if threads is not None else max(1, usable_cores() - busy_workers))
    try:
        yield
    finally:
        torch.set_num_threads(before)
