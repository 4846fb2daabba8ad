"""Checkpoint directories, written atomically.

    <run_dir>/checkpoints/<step:07d>/model.safetensors   weights (and normaliser buffers)
                                    /config.json         stage, model name + kwargs, resolved config, metadata
                                    /training_state.pt   optimizer, scheduler, step, RNG states (weights_only-safe)
    <run_dir>/checkpoints/last -> <step:07d>
    <run_dir>/checkpoints/best -> <step:07d>   the best evaluated step, when a stage keeps it

A checkpoint is first written to a hidden temporary folder, synced to disk and renamed into place, so a
reader never sees a half-written one; ``last`` and ``best`` are swapped with an atomic rename of a fresh
symlink. Weights with NaN or inf are never written, and the checkpoints ``last`` and ``best`` point to are
never pruned.
"""

from __future__ import annotations

import copy
import json
import os
import platform
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

import ript
from ript.errors import RiptError
from ript.utils.atomic import atomic_replace, fsync_path
from ript.utils.containers import to_dict
from ript.utils.logging import log
from ript.utils.seeding import rng_state, set_rng_state

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
TRAINING_STATE = "training_state.pt"


def first_non_finite(state: dict[str, torch.Tensor]) -> str | None:
    """The name of the first floating tensor holding NaN or inf, or None."""
    for name, t in state.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return name
    return None


def refuse_non_finite(state: dict[str, torch.Tensor], run_dir: Path, step: int) -> None:
    """Weights with NaN or inf are never written: a one-line error naming the first such weight."""
    bad = first_non_finite(state)
    if bad is not None:
        raise RiptError(f"refusing to write checkpoint {step}: weight {bad!r} has NaN or inf values "
                        f"(the last good checkpoint stays {Path(run_dir) / 'checkpoints' / 'last'})")


@contextmanager
def removed_on_failure(folder: Path, final: Path) -> Iterator[None]:
    """Files written into the hidden ``folder`` on the way to checkpoint ``final``: if writing fails, ``folder``
    is removed, and a disk that is full or read-only (torch and safetensors wrap the OSError) becomes one line."""
    try:
        yield
    except (OSError, SafetensorError, RuntimeError) as e:
        shutil.rmtree(folder, ignore_errors=True)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RiptError(f"cannot write checkpoint {final}: {first}; the last checkpoint is untouched "
                        f"(free disk space, then resume=true)") from e
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def host_copy(obj: Any) -> Any:
    """``obj`` with every tensor in it copied to host memory, contiguous (dicts, lists and tuples rebuilt, other
    values deep-copied): a snapshot that the training going on cannot change while it is being written."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True).contiguous()
    if isinstance(obj, dict):
        return {k: host_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(host_copy(v) for v in obj)
    return copy.deepcopy(obj)


def remove_partial_checkpoints(run_dir: Path) -> None:
    """Delete what a killed save leaves: hidden temporary checkpoint folders and link files."""
    root = Path(run_dir) / "checkpoints"
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith("."):
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


def host_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A module's state as contiguous host tensors, as safetensors files take them."""
    return {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: torch.nn.Module | None,
    config: dict[str, Any],
    training_state: dict[str, Any] | None = None,
    keep_last: int | None = None,
    write_extra: Callable[[Path], None] | None = None,
    weights_state: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write ``checkpoints/<step>`` atomically and point ``last`` at it; then keep the newest ``keep_last``
    steps (None or 0: all) and always the ones ``last`` and ``best`` point to. Returns the checkpoint dir.
    ``weights_state``: the weights to write (a snapshot of them, or where ``model`` does not hold them whole: FSDP;
    ``model`` is then not read)."""
    if keep_last is not None and keep_last < 0:
        raise RiptError(f"keep_last={keep_last}: must be 0 (keep every checkpoint) or a positive count")
    state = host_state(model) if weights_state is None else weights_state
    refuse_non_finite(state, run_dir, step)
    ckpt_root = Path(run_dir) / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"{step:07d}"
    tmp = Path(tempfile.mkdtemp(dir=ckpt_root, prefix=f".{step:07d}."))
    tmp.chmod(0o755)  # mkdtemp makes it private
    with removed_on_failure(tmp, final):
        save_file(state, str(tmp / WEIGHTS))
        (tmp / CONFIG).write_text(json.dumps({**config, "step": step}, indent=2, default=str))
        if training_state is not None:
            torch.save(training_state, tmp / TRAINING_STATE)
        if write_extra is not None:  # e.g. an OFT LoRA adapter in peft's format, inside the same atomic folder
            write_extra(tmp)
        if final.exists():  # re-saving a step (e.g. after resume): move the old one aside first
            old = ckpt_root / f".old.{final.name}.{os.getpid()}"
            os.replace(final, old)
            atomic_replace(tmp, final)
            shutil.rmtree(old)
        else:
            atomic_replace(tmp, final)
    _point(ckpt_root, "last", final.name)
    if keep_last:
        best = ckpt_root / "best"
        best_target = best.resolve() if best.is_symlink() else None
        steps = sorted(p for p in ckpt_root.iterdir() if p.name.isdigit() and p != final)
        for old in steps[:max(0, len(steps) - (keep_last - 1))]:
            if old.resolve() != best_target:
                shutil.rmtree(old)
    return final


def _point(ckpt_root: Path, link: str, target: str) -> None:
    """Atomically make ``ckpt_root/link`` a symlink to ``target`` (a step folder's name)."""
    link_tmp = ckpt_root / f".{link}.{os.getpid()}"
    if link_tmp.is_symlink() or link_tmp.exists():
        link_tmp.unlink()
    os.symlink(target, link_tmp)
    os.replace(link_tmp, ckpt_root / link)
    fsync_path(ckpt_root)


def mark_best(run_dir: Path, step: int) -> Path:
    """Point ``checkpoints/best`` at the saved checkpoint of ``step``."""
    ckpt_root = Path(run_dir) / "checkpoints"
    target = ckpt_root / f"{step:07d}"
    if not (target / CONFIG).is_file():
        raise RiptError(f"cannot mark step {step} best: {target} is not a checkpoint")
    _point(ckpt_root, "best", target.name)
    return target


def resolve_checkpoint_dir(path: str | Path) -> Path:
    """Accept a run dir, its ``checkpoints`` dir, ``last``, or one step's dir."""
    p = Path(path)
    if not p.exists():
        raise RiptError(f"checkpoint {p} does not exist")
    for candidate in (p / "checkpoints" / "last", p / "last", p):
        if (candidate / CONFIG).is_file():
            return candidate.resolve()
    raise RiptError(f"{p} is not a checkpoint: no {CONFIG} in it, in {p}/last or in {p}/checkpoints/last")


def read_checkpoint_config(ckpt_dir: Path) -> dict[str, Any]:
    path = Path(ckpt_dir) / CONFIG
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise RiptError(f"cannot read {path}: {e}") from None


def load_weights(ckpt_dir: Path, name: str = WEIGHTS) -> dict[str, torch.Tensor]:
    """A checkpoint's safetensors file (the model's weights, or another module's, e.g. RL's critic), checked."""
    path = Path(ckpt_dir) / name
    try:
        state = load_file(str(path))
    except (OSError, SafetensorError) as e:
        raise RiptError(f"cannot read weights {path}: {e}") from None
    bad = first_non_finite(state)
    if bad is not None:
        raise RiptError(f"weights {path}: tensor {bad!r} has NaN or inf values")
    return state


def load_training_state(ckpt_dir: Path) -> dict[str, Any]:
    path = Path(ckpt_dir) / TRAINING_STATE
    if not path.is_file():
        raise RiptError(f"{path} is missing: this checkpoint cannot be resumed")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a corrupt file
        raise RiptError(f"cannot read training state {path}: {e}") from None


def versions() -> dict[str, str]:
    import h5py
    import numpy

    out = {"ript": ript.__version__, "torch": torch.__version__, "numpy": numpy.__version__,
           "h5py": h5py.__version__, "python": platform.python_version()}
    for name in ("mujoco", "metaworld", "vector_quantize_pytorch"):
        try:
            out[name] = __import__(name).__version__
        except (ImportError, AttributeError):
            pass
    return out


def checkpoint_config(stage: str, model_name: str, model_kwargs: dict, cfg, metadata: dict,
                      weights_format: str = "full") -> dict[str, Any]:
    """``config.json`` of a checkpoint (see ``ript.model_loader`` for the weight formats)."""
    return {"stage": stage, "model_name": model_name, "model_kwargs": model_kwargs, "weights_format": weights_format,
            "cfg": to_dict(cfg), "metadata": metadata, "versions": versions()}


def rank_state(**streams: Any) -> dict[str, Any]:
    """This rank's part of a training state: the global RNG states and the stage's own random streams (the
    data order's generator; RL's initial-condition sampler and policy-sampling generator)."""
    return {"rng": rng_state(), **streams}


def training_state(optimizer: dict[str, Any], sched, step: int, run_id: str, ranks: list[dict[str, Any]]
                   ) -> dict[str, Any]:
    """The one training-state schema of every stage (an RL iteration is a step): the optimiser's state, the
    schedule, step, the logger's run id, and one ``rank_state`` per rank."""
    return {"optimizer": optimizer, "scheduler": sched.state_dict(), "step": step, "logger_run_id": run_id,
            "ranks": ranks}


def moments_laid_out_as_params(opt: torch.optim.Optimizer) -> None:
    """Give each optimiser state tensor its parameter's strides. Checkpoints keep the state contiguous
    (``host_copy``), while channels-last weights have other strides, and CUDA's fused Adam refuses moments whose
    strides differ from their parameter's ("must have same dtype, device, and layout")."""
    for param, per in opt.state.items():
        for key, value in per.items():
            if torch.is_tensor(value) and value.shape == param.shape and value.stride() != param.stride():
                per[key] = torch.empty_like(param, dtype=value.dtype).copy_(value)


def check_process_count(ckpt: Path, written: int, world_size: int, fewer_ranks: bool, rank: int) -> None:
    """A checkpoint of ``written`` processes resumes on as many, or on fewer with ``fewer_ranks``."""
    if written == world_size:
        return
    if not fewer_ranks or world_size > written:
        fewer = " or fewer with resume_fewer_ranks=true (not an exact resume)" if world_size < written else ""
        raise RiptError(f"{ckpt}: written by {written} process(es); resume it with the same number "
                        f"(torchrun --nproc_per_node={written}){fewer}, not {world_size}")
    if rank == 0:
        log.warning("%s: written by %d processes, continued on %d (resume_fewer_ranks): the random streams of ranks "
                    "%d..%d are dropped; not an exact resume", ckpt, written, world_size, world_size, written - 1)


def restore_training_state(ckpt: Path, opt, sched, rank: int, world_size: int,
                           load_optimizer: Callable[[Any, dict], None], fewer_ranks: bool = False
                           ) -> tuple[int, str, dict[str, Any]]:
    """Load the optimiser, schedule and this rank's RNG states; returns (step, logger run id, this rank's
    streams for the stage to restore). A run resumes with the process count that wrote it (each rank's random
    streams continue), or with ``fewer_ranks`` on fewer (rank r takes rank r's streams; the others' are
    dropped). Reads the layouts written before the schema was shared, too. ``load_optimizer(opt, state)``
    gives ``opt`` its state (``WholeState.load_optimizer``; under FSDP sharded again)."""
    state = load_training_state(ckpt)
    if "ranks" in state:
        check_process_count(ckpt, len(state["ranks"]), world_size, fewer_ranks, rank)
    load_optimizer(opt, state["optimizer"])
    moments_laid_out_as_params(opt)
    sched.load_state_dict(state["scheduler"])
    if "ranks" in state:
        mine, step = state["ranks"][rank], state.get("step", state.get("iteration"))
    else:  # stage 0/1 checkpoints of earlier versions
        mine, step = {"rng": state["rng"], "data_rng": state["data_rng"]}, state["step"]
    set_rng_state(mine["rng"])
    return int(step), state["logger_run_id"], mine
