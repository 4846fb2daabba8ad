"""Pieces every training stage shares: run directories, optimiser and schedule, batches, training state."""

from __future__ import annotations

import contextlib
import math
import platform
import time
from pathlib import Path
from typing import Any, Iterator

import torch

import ript
from ript.config import to_dict
from ript.data.dataset import ChunkDataset, batch_indices
from ript.errors import RiptError
from ript.utils.checkpoint import load_training_state
from ript.utils.run_dir import prepare_run_dir  # noqa: F401  (the stages' entry point)
from ript.utils.seeding import rng_state, set_rng_state


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


def checkpoint_config(stage: str, model_name: str, model_kwargs: dict, cfg, metadata: dict) -> dict[str, Any]:
    return {"stage": stage, "model_name": model_name, "model_kwargs": model_kwargs, "cfg": to_dict(cfg),
            "metadata": metadata, "versions": versions()}


def make_optimizer(params, train_cfg, total_steps: int, device: str):
    params = [p for p in params if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=train_cfg.lr, weight_decay=train_cfg.weight_decay, betas=(0.9, 0.95),
                            fused=device.startswith("cuda"))
    warmup = max(0, int(train_cfg.warmup_steps))

    def schedule(step: int) -> float:  # linear warm-up, then cosine to 10% of the peak rate
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, schedule)


def autocast(device: str, amp: str | bool):
    enabled = device.startswith("cuda") if amp == "auto" else bool(amp)
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16)


def batch_stream(dataset: ChunkDataset, batch_size: int, seed: int, start_step: int) -> Iterator[tuple[int, torch.Tensor]]:
    """(step, sample indices) from ``start_step`` on; the order depends only on (seed, step)."""
    n_batches = len(batch_indices(len(dataset), batch_size, 0, seed))
    step = start_step
    while True:
        epoch, i = divmod(step, n_batches)
        order = batch_indices(len(dataset), batch_size, epoch, seed)
        for j in range(i, n_batches):
            yield step, order[j]
            step += 1


def out_of_time(t_start: float, minutes: float | None) -> bool:
    """For time-limited jobs: stop (with a checkpoint) once ``train.stop_after_minutes`` have passed."""
    return minutes is not None and time.perf_counter() - t_start > 60 * float(minutes)


def training_state(opt, sched, step: int, generator: torch.Generator, run_id: str, extra: dict | None = None) -> dict:
    return {"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "step": step, "rng": rng_state(),
            "data_rng": generator.get_state(), "logger_run_id": run_id, **(extra or {})}


def restore_training_state(ckpt: Path, opt, sched, generator: torch.Generator) -> dict:
    state = load_training_state(ckpt)
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    generator.set_state(state["data_rng"])  # a CPU ByteTensor, whatever the generator's device
    return state


class NonFiniteLoss(RiptError):
    """A training loss or gradient became NaN/inf; no update was applied and no checkpoint is written."""


def grad_norm_step(model: torch.nn.Module, opt, sched, loss: torch.Tensor, clip: float, step: int) -> float:
    """One optimiser step; refuses (before touching the weights) when the loss or the gradient is not finite."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], clip)
    loss_value, norm_value = torch.stack([loss.detach().float(), norm.float()]).tolist()  # one device sync
    if not (math.isfinite(loss_value) and math.isfinite(norm_value)):
        raise NonFiniteLoss(f"non-finite training loss {loss_value} (gradient norm {norm_value}) at step {step + 1}; "
                            f"no update applied, checkpoints/last is the last good checkpoint; "
                            f"lower train.lr or check the data")
    opt.step()
    sched.step()
    return norm_value


def load_datasets(spec_kwargs: dict, device: str, on_device: str | bool) -> tuple[ChunkDataset, ChunkDataset | None]:
    from ript.data.dataset import DatasetSpec, EmptySplitError

    spec = DatasetSpec(**spec_kwargs)
    train = ChunkDataset(spec, "train")
    try:
        val = ChunkDataset(spec, "val") if spec.val_fraction > 0 else None
    except EmptySplitError:  # too few demos to hold any out; a damaged file still fails
        val = None
    move = device.startswith("cuda") if on_device == "auto" else bool(on_device)
    if move:
        train.to(device)
        if val is not None:
            val.to(device)
    return train, val
