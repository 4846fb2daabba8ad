"""Atomic, durable file writes (kept free of torch: env and collection workers use them)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def fsync_path(path: Path) -> None:
    """Flush a file's or a folder's entries to disk (a rename is durable only once its folder is synced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_replace(tmp: Path, path: Path) -> None:
    """Sync ``tmp`` (a file, or a folder and its files), rename it to ``path``, sync the parent folder."""
    tmp = Path(tmp)
    if tmp.is_dir():
        for child in tmp.rglob("*"):
            fsync_path(child)
    fsync_path(tmp)
    os.replace(tmp, path)
    fsync_path(Path(path).parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a synced temporary file and a rename (readable like any output)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes it private
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        atomic_replace(Path(tmp), path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())
