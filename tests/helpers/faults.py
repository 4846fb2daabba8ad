"""Fault injection for tests and the bad-input matrix: the process table, an env's worker processes, a full disk."""

from __future__ import annotations

import time
from pathlib import Path


def processes() -> list[dict]:
    """Every process's pid, parent, process group, state and command line, from /proc."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        out.append({"pid": int(stat.parent.name), "state": fields[0], "ppid": int(fields[1]),
                    "pgid": int(fields[2]), "cmdline": cmdline})
    return out


def env_workers(parent: int, n: int, timeout: float = 120) -> list[int]:
    """The spawned worker processes of ``parent`` (not spawn's resource tracker), once ``n`` are running."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        workers = sorted(p["pid"] for p in processes() if p["ppid"] == parent and b"spawn_main" in p["cmdline"]
                         and b"resource_tracker" not in p["cmdline"])
        if len(workers) >= n:
            return workers
        time.sleep(0.1)
    raise RuntimeError(f"{n} worker processes of {parent} did not start in {timeout:.0f} s")


def fill_disk(folder: Path) -> None:
    """Write zeros into ``folder`` until its filesystem is full."""
    with open(folder / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
