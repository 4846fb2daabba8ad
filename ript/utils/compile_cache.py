"""Compiled kernels kept with a run: what ``torch.compile`` built (Inductor's graphs and kernels, AOTAutograd's
forward and backward, autotuning choices), saved as one file in the run folder, so that a resumed run on a fresh
host (where the compiler's own on-disk cache is empty) starts without compiling again. ``compile_cache=<file>``
starts a new run from another run's file. A cache entry is used only where the compiler's own key matches (the
same graph, torch version and device), so a file from another host or model costs nothing but its loading."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import torch

from ript.errors import RiptError
from ript.utils.atomic import atomic_write_bytes
from ript.utils.logging import log

CACHE_FILE = "compile_cache.bin"


def artifact_count(info) -> int:
    return sum(len(keys) for keys in info.artifacts.values())


class CompileCache:
    """Loads the run's own cache (a resumed run) and the ``given`` file, if any, before anything compiles; ``save``
    (rank 0, with each checkpoint) rewrites the run's file when the process holds more compiled artifacts than the
    file has."""

    def __init__(self, run_dir: Path, given: str | None, is_main: bool):
        self.path, self.is_main, self.saved = Path(run_dir) / CACHE_FILE, is_main, 0
        if given:
            self.load(Path(given), required=True)
        if self.path.exists() and (not given or Path(given).resolve() != self.path.resolve()):
            self.load(self.path, required=False)

    def load(self, path: Path, required: bool) -> None:
        """``required``: a file the user named (missing or unreadable: one line); else the run's own, which a
        later save replaces (unreadable: a warning, and the run compiles)."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise RiptError(f"compile_cache={path}: no such file (a run folder's {CACHE_FILE})") from None
        torch_log = logging.getLogger("torch.compiler._cache")
        level = torch_log.level
        torch_log.setLevel(logging.ERROR)  # a torn file is said below in one line, not with torch's traceback
        try:
            info = torch.compiler.load_cache_artifacts(data)
        except Exception:  # noqa: BLE001  (torch versions differ: some raise on a torn file, others return None)
            info = None
        finally:
            torch_log.setLevel(level)
        if info is None:
            if required:
                raise RiptError(f"compile_cache={path}: not a compile cache (a run folder's {CACHE_FILE})")
            log.warning("%s is not a compile cache; this run compiles afresh and replaces it", path)
            return
        log.info("compile cache: %d compiled artifacts loaded from %s", artifact_count(info), path)

    def save(self) -> None:
        # Inductor's cache module is imported by its first compile: without it nothing was compiled, and asking
        # torch would import the compiler (~2 s) for nothing
        if not self.is_main or "torch._inductor.codecache" not in sys.modules:
            return
        saved = torch.compiler.save_cache_artifacts()
        if saved is None:  # nothing compiled in this process
            return
        data, info = saved
        count = artifact_count(info)
        if count > self.saved:
            atomic_write_bytes(self.path, data)
            self.saved = count
