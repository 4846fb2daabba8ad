"""Child-process hygiene shared by the collection pool, the env workers and the jobs that run other jobs."""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import signal
import subprocess
from pathlib import Path

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies, so a ``kill -9`` of a run leaves no orphaned
    workers (elsewhere this is a no-op; the workers then exit on their pipe's end of file)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def process_is_running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie: a killed process whose parent died first stays a
    zombie until init reaps it, and in a container whose init never reaps it holds its pid for good."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    with contextlib.suppress(OSError, ValueError, IndexError):  # no /proc (not Linux): the signal's answer stands
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2] != "Z"  # the state follows the command name, which may hold spaces
    return True


FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STACKS_SIGNAL = signal.SIGUSR1


def stacks_on_signal() -> None:
    """``kill -USR1 <pid>`` prints every thread's Python stack of this process to its stderr, and the process goes
    on: how a run that waits where it should not says where (registered by the ``ript`` command and its env
    workers). A process ended by a fatal signal (a crash in native code, NCCL's watchdog aborting a rank that
    waited too long in a collective) prints them too."""
    faulthandler.register(STACKS_SIGNAL, all_threads=True)
    faulthandler.enable(all_threads=True)


def stacks_when_stopped() -> None:
    """A torchrun rank: SIGTERM (torchrun stopping the ranks left when one failed) prints every thread's stack,
    then ends the process as before, so that a rank that waited where it should not says where."""
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)


def run_with_time_limit(command: list[str], limit_s: float, env: dict[str, str] | None = None,
                        preexec_fn=None) -> tuple[int | None, str, str]:
    """Run ``command`` in a session of its own to its end or for ``limit_s`` seconds: (exit code, stdout, stderr),
    the exit code None when the limit ended it. At the limit every process of the session is sent
    ``STACKS_SIGNAL`` (ript's print their stacks into the stderr returned), then killed."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=preexec_fn, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit_s)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, STACKS_SIGNAL)
    try:  # the stacks are written at once; a process without the handler ends on the signal
        out, err = proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    return None, out, err


def run_child(command: list[str], env: dict[str, str] | None = None) -> int:
    """Run ``command`` to its end as a child that ends with this process; its exit code.

    The child runs in its own process group, so that a Ctrl-C in the terminal reaches it once, through us:
    SIGINT, SIGTERM and SIGHUP sent to this process are forwarded to it, and this process waits for it to exit
    before it ends itself (SIGINT: KeyboardInterrupt; SIGTERM, SIGHUP: SystemExit(128 + signal)). A SIGKILLed
    parent's child is killed by the kernel (``die_with_parent``). ``env`` adds to this process's environment."""
    received: list[int] = []
    child: list[subprocess.Popen] = []

    def forward(signum, frame) -> None:
        received.append(signum)
        for proc in child:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)

    def start_child() -> None:  # in the child, before its program starts
        os.setpgid(0, 0)  # its own process group (Popen's process_group= needs Python 3.11)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
        die_with_parent()

    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        # signals that come while the child starts wait until it can be given them
        signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
        try:
            child.append(subprocess.Popen(command, preexec_fn=start_child, env={**os.environ, **(env or {})}))
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
        code = child[0].wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if received:
        if signal.SIGINT in received:
            raise KeyboardInterrupt
        raise SystemExit(128 + received[0])
    return code


def available_memory_bytes() -> int:
    """Host memory a new allocation can still take without swapping (Linux's MemAvailable: free memory plus the
    page cache it can drop; elsewhere the free pages; 0 where neither can be read, so callers plan for the least)."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    with contextlib.suppress(OSError, ValueError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    return 0


def ranks_on_this_host() -> int:
    """The processes of a torchrun job on this host (1 outside one), each with env workers of its own."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


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
