"""The bookkeeping every training loop shares, written once: resume from the run folder's last checkpoint,
periodic checkpoints (the newest ``keep_last`` kept, and the best one), the metric logger, a progress bar,
throughput, metric sums over ranks by name (one collective), and the time limit every rank agrees on.

A loop (stage 0, stage 1 and fine-tuning, RL) keeps only what is its own: the batches, the loss, the metrics
and what it evaluates; steps are optimiser steps or RL iterations alike."""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from ript.errors import RiptError
from ript.utils import distributed as ddist
from ript.utils.checkpoint import (
    host_copy,
    mark_best,
    rank_state,
    refuse_non_finite,
    removed_on_failure,
    restore_training_state,
    save_checkpoint,
    training_state,
)
from ript.utils.checkpoint import (
    load_weights as read_weights,
)
from ript.utils.compile_cache import CompileCache
from ript.utils.fsdp import WholeState
from ript.utils.locking import release
from ript.utils.logging import MetricLogger, log
from ript.utils.training import WeightAverage, averaged


def due(every: int, done: int, total: int) -> bool:
    """Whether something done every ``every`` steps (and after the last) falls after step ``done``; 0: never."""
    return bool(every) and (done % every == 0 or done == total)


def sum_by_name(sums: dict[str, float], info: ddist.DistInfo) -> dict[str, float]:
    """Each named value summed over ranks, in one collective (alone: the values as given)."""
    return dict(zip(sums, ddist.all_sum(list(sums.values()), info)))


class Throughput:
    """Samples per second between two readings (the time the loop spends logging included)."""

    def __init__(self):
        self.since, self.count = time.perf_counter(), 0

    def add(self, count: int) -> None:
        self.count += count

    def read(self) -> float:
        """Samples per second since the last reading; starts the next interval."""
        now = time.perf_counter()
        rate = self.count / (now - self.since)
        self.since, self.count = now, 0
        return rate


class Timer:
    """Seconds per named phase of one step (``with timer("rollout"): ...``); phases may nest."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = time.perf_counter() - t


@dataclass(frozen=True)
class RunSettings:
    """What the bookkeeping of one run reads: its name in log lines, what a step is called, the run folder and
    the checkpoint to resume from (``prepare_ranked_run_dir``), how many checkpoints to keep, the time limit."""
    name: str
    run_dir: Path
    resume_from: Path | None
    keep_last: int | None
    stop_after_minutes: float | None
    unit: str = "step"
    compile_cache: str | None = None  # another run's compiled kernels to start from (``CompileCache``)
    fewer_ranks: bool = False  # ``resume_fewer_ranks``: a checkpoint of more processes may continue on these


class TrainingRun:
    """One run's resume, checkpoints, logger and clock, alone or under torchrun (every rank calls every method;
    rank 0 writes files and logs). ``layout``: how the model and optimizer state are held (``ShardedState``: under
    FSDP, gathered whole to be written and sharded again on resume)."""

    def __init__(self, settings: RunSettings, info: ddist.DistInfo, opt, sched, layout: WholeState | None = None,
                 average: WeightAverage | None = None):
        self.settings, self.info, self.opt, self.sched = settings, info, opt, sched
        self.layout = layout or WholeState()
        self.average = average  # train.ema_decay: checkpoints hold the average, and the trained weights beside it
        self.run_dir = Path(settings.run_dir)
        self.start, self.run_id = 0, None
        self.logger: MetricLogger | None = None
        self.writes = BackgroundWrites()
        self.compiled = CompileCache(self.run_dir, settings.compile_cache, info.is_main)  # before anything compiles
        self.t_start = time.perf_counter()

    def resume(self, load_weights: Callable[[Path], None]) -> dict[str, Any] | None:
        """From the checkpoint found at start (if any): ``load_weights(folder)``, then the optimiser, schedule,
        RNG states and step; returns this rank's own streams (None when starting afresh)."""
        ckpt = self.settings.resume_from
        if ckpt is None:
            return None
        load_weights(ckpt)
        if self.average is not None:
            self.average.restore(read_weights(ckpt, WeightAverage.TRAINED), str(ckpt))
        self.start, self.run_id, streams = restore_training_state(ckpt, self.opt, self.sched, self.info.rank,
                                                                  self.info.world_size, self.layout.load_optimizer,
                                                                  self.settings.fewer_ranks)
        log.info("%s: resumed from %s at %s %d", self.settings.name, ckpt, self.settings.unit, self.start)
        return streams

    def open_logger(self, config: dict[str, Any]) -> MetricLogger:
        """The metric logger (after ``resume``: a resumed run logs under its first run id); starts the clock."""
        self.logger = MetricLogger(self.run_dir, config, self.run_id, enabled=self.info.is_main)
        self.t_start = time.perf_counter()
        return self.logger

    def progress(self, total: int, enabled: bool):
        """A progress bar over the run's steps (rank 0, if ``enabled``)."""
        from tqdm import tqdm

        return tqdm(total=total, initial=self.start, desc=self.settings.name, unit=self.settings.unit,
                    disable=not (enabled and self.info.is_main))

    def save(self, step: int, weights, config: dict[str, Any], streams: dict[str, Any],
             write_extra: Callable[[Path, dict | None], None] | None = None) -> None:
        """``checkpoints/<step>``: ``weights``' state, ``config`` as config.json, the training state with every
        rank's ``streams`` (and its RNG states); ``write_extra(folder, whole)`` adds files inside the same atomic
        write (``whole``: the weights gathered whole where the layout shards them, else None).

        The state is copied to host memory here and written on a thread of its own while training goes on (an RL
        iteration used to wait for its checkpoint's write); the next save, ``keep_best``, ``finish`` and
        ``close`` wait for it, and a write that failed is raised there."""
        ranks = ddist.gather_objects(rank_state(**streams), self.info)
        main = self.info.is_main
        whole, optimizer = self.layout.weights(weights, main), self.layout.optimizer(self.opt, main)  # every rank
        if main:
            self.writes.wait()  # one write at a time, in order
            state = host_copy(training_state(optimizer, self.sched, step, self.logger.run_id, ranks))
            trained = None if self.average is None else host_copy(weights.state_dict())  # a whole model's file
            with averaged(self.average):
                snapshot = host_copy(weights.state_dict() if whole is None else whole)
            refuse_non_finite(snapshot, self.run_dir, step)
            extra = None if write_extra is None else staged_extra(self.run_dir, step, write_extra, whole)
            if trained is not None:
                extra = with_trained_weights(trained, extra)
            self.writes.submit(functools.partial(save_checkpoint, self.run_dir, step, None, config, state,
                                                 keep_last=self.settings.keep_last, write_extra=extra,
                                                 weights_state=snapshot))
            self.compiled.save()  # what compiled so far, for a resume on a host whose compiler cache is empty
        ddist.barrier(self.info)

    def keep_best(self, step: int, score: float, results_file: Callable[[int], Path]) -> None:
        """Point ``checkpoints/best`` at the saved ``step`` if its ``score`` beats the best so far (rank 0; ties:
        the earlier step stays). The best score is read back from its evaluation (``results_file(step)``), so a
        resumed run compares against the run's whole history."""
        self.writes.wait()  # the step's checkpoint on disk
        best = best_score(self.run_dir, results_file)
        if best is None or score > best[0]:
            mark_best(self.run_dir, step)
            log.info("%s: %s %d is the best so far (%.1f%%): %s", self.settings.name, self.settings.unit, step,
                     100 * score, self.run_dir / "checkpoints" / "best")

    def out_of_time(self) -> bool:
        """``stop_after_minutes`` passed, agreed on by every rank (one stops, all stop after the same step);
        without a time limit no collective runs, so a step stays free of a per-step all-reduce."""
        minutes = self.settings.stop_after_minutes
        if minutes is None:
            return False
        return ddist.any_rank(time.perf_counter() - self.t_start > 60 * float(minutes), self.info)

    def stopped(self, step: int) -> None:
        log.info("%s: stopped after %s min at %s %d; continue with resume=true", self.settings.name,
                 self.settings.stop_after_minutes, self.settings.unit, step)

    def finish(self) -> None:
        """After the last step: every rank waits for rank 0's last checkpoint before it reports the run done."""
        self.writes.wait()
        ddist.barrier(self.info)

    def close(self) -> None:
        """The last checkpoint written, the logger's files flushed, the process group left and the run folder's
        lock released (also after an error), so that the same process may start another job on the folder. A
        write that failed is raised, unless the run is ending on an error already (then it is logged)."""
        try:
            self.writes.close(raise_error=sys.exc_info()[0] is None)
        finally:
            if self.logger is not None:
                self.logger.close()
            ddist.shutdown(self.info)
            release(self.settings.run_dir)


class BackgroundWrites:
    """Checkpoint writes on a thread of their own, one at a time: ``wait`` returns once the last one is on disk
    and raises its error."""

    def __init__(self):
        self.pool: ThreadPoolExecutor | None = None
        self.pending: Future | None = None

    def submit(self, write: Callable[[], Any]) -> None:
        self.wait()
        if self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ript-checkpoint")
        self.pending = self.pool.submit(write)

    def wait(self) -> None:
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()

    def close(self, raise_error: bool = True) -> None:
        try:
            self.wait()
        except Exception as e:  # noqa: BLE001  (the run is failing already: its own error is the one to show)
            if raise_error:
                raise
            log.error("the last checkpoint was not written: %s", e)
        finally:
            if self.pool is not None:
                self.pool.shutdown(wait=True)
                self.pool = None


def staged_extra(run_dir: Path, step: int, write_extra: Callable[[Path, dict | None], None],
                 whole: dict | None) -> Callable[[Path], None]:
    """``write_extra``'s files written now (they read the live model) into a hidden folder beside the
    checkpoints, and the function that moves them into the checkpoint's own folder when it is written."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(dir=root, prefix=f".{step:07d}.extra."))  # removed at start if left behind
    with removed_on_failure(staged, root / f"{step:07d}"):
        write_extra(staged, whole)

    def move_into(folder: Path) -> None:
        for path in staged.iterdir():
            os.replace(path, folder / path.name)
        staged.rmdir()

    return move_into


def with_trained_weights(trained: dict, extra: Callable[[Path], None] | None) -> Callable[[Path], None]:
    """``extra`` (if any), and the trained weights written beside a checkpoint that holds their average."""

    def write(folder: Path) -> None:
        save_file(trained, str(folder / WeightAverage.TRAINED))
        if extra is not None:
            extra(folder)

    return write


def best_score(run_dir: Path, results_file: Callable[[int], Path], key: str = "success_rate"
               ) -> tuple[float, int] | None:
    """(score, step) of the checkpoint ``checkpoints/best`` points to, read from its evaluation's results
    (``results_file(step)``, a JSON file holding ``key``); None before the first evaluation."""
    link = Path(run_dir) / "checkpoints" / "best"
    if not link.is_symlink():
        return None
    step = int(os.readlink(link))
    results = results_file(step)
    try:
        return float(json.loads(results.read_text())[key]), step
    except (OSError, ValueError, KeyError) as e:
        raise RiptError(f"{link} points to step {step}, but its evaluation {results} cannot be read ({e}); "
                        f"remove the link to start the comparison afresh") from e
