"""One writer per folder: an advisory lock that a job holds on every run, data or results folder it writes.

The lock is ``fcntl.flock`` on ``<folder>/.ript.lock``, which holds the holder's PID, host, command and start time
as JSON and is removed when the holder exits. The kernel releases the lock however the holder ends (a ``kill -9``
included), so the file a killed holder leaves is taken over (with a line saying so); a second writer of a held
folder ends at once with one line naming the holder. A lock is held until the job ends (``holding``) or its
process exits (``hold_folder``); taking a folder the process already holds does nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path

from ript.errors import RiptError
from ript.utils.logging import log

LOCK_FILE = ".ript.lock"
_held: dict[Path, int] = {}  # folder (resolved) -> the open lock file's descriptor, kept open while we hold it


def command_line() -> str:
    """This process's command as a user would type it (``ript collect ...``, not ``.../ript/cli.py collect ...``)."""
    argv = list(sys.argv)
    if argv and Path(argv[0]).name in ("ript", "cli.py", "__main__.py"):
        argv[0] = "ript"
    return shlex.join(argv)


def describe_holder(holder: dict) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(holder.get("since", 0)))
    return f"PID {holder.get('pid')} on {holder.get('host')} (`{holder.get('command')}`, since {since})"


def _read_holder(fd: int) -> dict | None:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 65536)
    try:
        holder = json.loads(raw) if raw.strip() else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return holder if isinstance(holder, dict) else None


def _unwritable(folder: Path, key: str, e: OSError):
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        raise e  # the CLI's one line for a full disk
    raise RiptError(f"cannot write {key} {folder}: {e.strerror} (read-only or not yours); choose a writable "
                    f"{key}") from None


def _lock(folder: Path, key: str) -> int:
    """The locked descriptor of ``folder``'s lock file. A lock file that its last holder removed between our open
    and our lock is not the folder's lock any more: open again."""
    path = folder / LOCK_FILE
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            _unwritable(folder, key, e)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                os.close(fd)
                raise
            holder = _read_holder(fd)
            os.close(fd)
            who = describe_holder(holder) if holder else "another process"
            raise RiptError(f"{folder} is being written by {who}; wait for it to end (or stop it) before writing "
                            f"there, or choose another {key}") from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def hold_folder(folder: Path, key: str) -> None:
    """Create ``folder`` if needed and hold its lock until this process exits; a RiptError naming the holder if
    another process holds it, or naming ``key`` if the folder cannot be written (checked here, before any work)."""
    folder = Path(folder)
    resolved = folder.resolve()
    if resolved in _held:
        return
    if folder.exists() and not folder.is_dir():
        raise RiptError(f"{key} {folder} is a file, not a folder; choose another {key}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _unwritable(folder, key, e)
    fd = _lock(folder, key)
    previous = _read_holder(fd)
    if previous is not None:  # its holder ended without releasing it (killed): the kernel dropped its lock
        log.info("%s: taking over the lock left by %s, which ended without releasing it", folder,
                 describe_holder(previous))
    record = {"pid": os.getpid(), "host": socket.gethostname(), "command": command_line(), "since": time.time()}
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    _held[resolved] = fd
    try:
        os.write(fd, json.dumps(record).encode())
    except OSError as e:  # a full disk: the lock holds without its record, and the job's own write reports it
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise


@contextlib.contextmanager
def holding(folder: Path, key: str):
    """``hold_folder`` for the duration of a job run in this process (a lock this process already held stays)."""
    held = Path(folder).resolve() in _held
    hold_folder(folder, key)
    try:
        yield
    finally:
        if not held:
            release(folder)


def release(folder: Path) -> None:
    """Remove and unlock the lock of ``folder`` (removed while still locked: see ``_lock``); a killed holder
    leaves its file, which the next writer takes over."""
    resolved = Path(folder).resolve()
    fd = _held.pop(resolved, None)
    if fd is None:
        return
    with contextlib.suppress(OSError):
        (resolved / LOCK_FILE).unlink()
    os.close(fd)


def release_all() -> None:
    for folder in list(_held):
        release(folder)


atexit.register(release_all)
