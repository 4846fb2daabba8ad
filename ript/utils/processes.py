"""Child-process hygiene shared by the collection pool and the env workers."""

from __future__ import annotations

import contextlib
import ctypes
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies, so a ``kill -9`` of a run leaves no orphaned
    workers (elsewhere this is a no-op; the workers then exit on their pipe's end of file)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
