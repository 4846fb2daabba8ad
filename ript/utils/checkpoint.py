"""Checkpoint directories, written atomically.

    <run_dir>/checkpoints/<step:07d>/model.safetensors   weights (and normaliser buffers)
                                    /config.json         stage, model name + kwargs, resolved config, metadata
                                    /training_state.pt   optimizer, scheduler, step, RNG states (weights_only-safe)
    <run_dir>/checkpoints/last -> <step:07d>

A checkpoint is first written to a hidden temporary folder and renamed into place, so a reader never
sees a half-written one; ``last`` is swapped with an atomic rename of a fresh symlink.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ript.errors import RiptError

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
TRAINING_STATE = "training_state.pt"


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.fchmod(fd, 0o644)  # mkstemp makes it private
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: torch.nn.Module,
    config: dict[str, Any],
    training_state: dict[str, Any] | None = None,
    keep_last: int | None = None,
) -> Path:
    """Write ``checkpoints/<step>`` atomically and point ``last`` at it. Returns the checkpoint dir."""
    ckpt_root = Path(run_dir) / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"{step:07d}"
    tmp = Path(tempfile.mkdtemp(dir=ckpt_root, prefix=f".{step:07d}."))
    tmp.chmod(0o755)  # mkdtemp makes it private
    try:
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        save_file(state, str(tmp / WEIGHTS))
        (tmp / CONFIG).write_text(json.dumps({**config, "step": step}, indent=2, default=str))
        if training_state is not None:
            torch.save(training_state, tmp / TRAINING_STATE)
        if final.exists():  # re-saving a step (e.g. after resume): move the old one aside first
            old = ckpt_root / f".old.{final.name}.{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    link_tmp = ckpt_root / f".last.{os.getpid()}"
    if link_tmp.is_symlink() or link_tmp.exists():
        link_tmp.unlink()
    os.symlink(final.name, link_tmp)
    os.replace(link_tmp, ckpt_root / "last")
    if keep_last:
        steps = sorted(p for p in ckpt_root.iterdir() if p.name.isdigit())
        for old in steps[:-keep_last]:
            shutil.rmtree(old)
    return final


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


def load_weights(ckpt_dir: Path) -> dict[str, torch.Tensor]:
    path = Path(ckpt_dir) / WEIGHTS
    try:
        return load_file(str(path))
    except (OSError, SafetensorError) as e:
        raise RiptError(f"cannot read weights {path}: {e}") from None


def load_training_state(ckpt_dir: Path) -> dict[str, Any]:
    path = Path(ckpt_dir) / TRAINING_STATE
    if not path.is_file():
        raise RiptError(f"{path} is missing: this checkpoint cannot be resumed")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a corrupt file
        raise RiptError(f"cannot read training state {path}: {e}") from None
