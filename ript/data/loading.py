"""Reading a split's demos from many HDF5 files into one set of arrays, in parallel for large datasets.

Decompressing the images is nearly all of the loading time (ML45 x 100 demos at 128 px: 35 GB in ~4 minutes
on one core), and h5py serialises every call within a process. So the files are first measured without
decompressing anything (``demo_layout``), the final arrays are allocated once in memory shared with child
processes, and forked workers each read a share of the files straight into their rows. Memory peaks at the
data itself plus a demo or two (joining per-demo arrays needed 1.5x). Every check and one-line error of
``iter_demos`` holds: the workers run it.
"""

from __future__ import annotations

import gc
import mmap
import multiprocessing as mp
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ript.data.hdf5 import Demo, DemoLayout, demo_layout, iter_demos
from ript.errors import RiptError

PARALLEL_FROM_BYTES = 256 * 2**20  # below this, forking workers costs more than it saves
MAX_LOAD_WORKERS = 16


@dataclass
class SplitArrays:
    layouts: list[DemoLayout]  # one per file, in file order
    actions: np.ndarray        # (N, action_dim) float32, every chosen demo of every file end to end
    obs: dict[str, np.ndarray]  # canonical key -> (N, ...)


def shared_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array in anonymous shared memory: what a forked child writes, the parent sees (not
    bound by the size of /dev/shm, which containers often keep small)."""
    count = int(np.prod(shape))
    buffer = mmap.mmap(-1, max(1, count * np.dtype(dtype).itemsize))
    return np.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)


def load_workers(nbytes: int, files: int) -> int:
    if nbytes < PARALLEL_FROM_BYTES or files < 2 or "fork" not in mp.get_all_start_methods():
        return 1
    return max(1, min(files, os.cpu_count() or 1, MAX_LOAD_WORKERS))


def balanced_shares(sizes: list[int], workers: int) -> list[list[int]]:
    """File positions split over ``workers`` with about equal rows each (largest file first to the least loaded)."""
    shares: list[list[int]] = [[] for _ in range(workers)]
    load = [0] * workers
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        w = load.index(min(load))
        shares[w].append(i)
        load[w] += sizes[i]
    return shares


def _fill(arrays: SplitArrays, files: list[int], first_rows: list[int], read: Callable[[int], Iterator[Demo]]) -> None:
    """Read ``files`` (positions in ``arrays.layouts``) into their rows."""
    for i in files:
        layout, row = arrays.layouts[i], first_rows[i]
        for demo in read(i):
            n = len(demo.actions)
            for key, dest, value in (("actions", arrays.actions, demo.actions),
                                     *((k, arrays.obs[k], demo.obs[k]) for k in arrays.obs)):
                if value.shape[1:] != dest.shape[1:]:
                    raise RiptError(f"{layout.path}: {key} has per-step shape {value.shape[1:]} but "
                                    f"{arrays.layouts[0].path} has {dest.shape[1:]}; one dataset needs one shape")
                dest[row:row + n] = value
            row += n


def _child(arrays, files, first_rows, read, errors) -> None:
    gc.disable()  # the parent's objects are not this process's to collect (see start_forked)
    try:
        _fill(arrays, files, first_rows, read)
    except Exception as e:  # noqa: BLE001 - reported to the parent as the one line it raises
        errors.put(str(e) if isinstance(e, RiptError) else f"{type(e).__name__}: {e}")
        os._exit(1)
    os._exit(0)  # no atexit handlers or inherited finalisers of the parent


def start_forked(procs: list) -> None:
    """Fork the readers with every object of the parent out of the garbage collector's reach: a cycle collected in a
    child runs destructors of objects whose threads did not survive the fork (a torch.distributed gloo group left
    from an earlier run waits forever for them)."""
    gc.freeze()
    try:
        for p in procs:
            p.start()
    finally:
        gc.unfreeze()


def load_split(files: list[Path], obs_keys: dict[str, str], max_demos: int | None, action_dim: int | None,
               flip_keys: tuple[str, ...], picks: list[Callable[[int], list[int]]],
               workers: int | None = None, action_key: str = "actions") -> SplitArrays:
    """Every chosen demo of ``files`` (``picks[i]`` chooses file i's demos) as one set of arrays, the actions
    read from each demo's ``action_key`` dataset. ``workers``: reading processes (None: by size, see
    ``load_workers``)."""
    layouts = [demo_layout(p, obs_keys, max_demos, pick, action_key) for p, pick in zip(files, picks)]
    rows = [sum(lay.lengths) for lay in layouts]
    total = sum(rows)
    first = next((lay for lay in layouts if lay.names), layouts[0])  # a wrong action dim: iter_demos says so
    shapes = {k: ((total, *shape), dtype) for k, (shape, dtype) in first.obs.items()}
    nbytes = total * first.action_dim * 4 + sum(int(np.prod(s)) * d.itemsize for s, d in shapes.values())
    workers = load_workers(nbytes, len(files)) if workers is None else workers
    alloc = shared_empty if workers > 1 else (lambda shape, dtype: np.empty(shape, dtype))
    arrays = SplitArrays(layouts, alloc((total, first.action_dim), np.float32),
                         {k: alloc(s, d) for k, (s, d) in shapes.items()})
    first_rows = [int(r) for r in np.cumsum([0] + rows)[:-1]]

    def read(i: int) -> Iterator[Demo]:  # one demo at a time, not a whole file
        return iter_demos(files[i], obs_keys, max_demos, action_dim, flip_keys, picks[i], action_key)

    if workers <= 1:
        _fill(arrays, list(range(len(files))), first_rows, read)
        return arrays
    ctx = mp.get_context("fork")
    errors = ctx.SimpleQueue()
    shares = balanced_shares(rows, workers)
    procs = [ctx.Process(target=_child, args=(arrays, share, first_rows, read, errors), daemon=True)
             for share in shares if share]
    start_forked(procs)
    for p in procs:
        p.join()
    if not errors.empty():
        raise RiptError(errors.get())
    dead = [p.exitcode for p in procs if p.exitcode != 0]
    if dead:
        raise RiptError(f"a dataset loading worker died (exit code {dead[0]}) reading {len(files)} files; "
                        f"out of memory? rerun with data.on_device=false or fewer demos")
    return arrays
