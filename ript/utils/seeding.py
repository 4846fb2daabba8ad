"""Seeding and RNG-state capture, so a resumed run continues the same random streams."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from ript.errors import RiptError


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@contextlib.contextmanager
def shared_draws(seed: int, device: str) -> Iterator[None]:
    """Torch's draws inside come from ``seed`` on every rank, and this rank's own stream continues after as if
    they had not been made: for weights built fresh that every rank must start from alike (LoRA, a scale head,
    a critic), since ranks that only average their gradients never bring different starts together."""
    devices = [torch.device(device)] if device.startswith("cuda") else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def rng_state() -> dict:
    """All global RNG states as tensors/ints, loadable with ``torch.load(weights_only=True)``."""
    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "python": torch.tensor(py_state, dtype=torch.int64),
        "python_gauss": -1.0 if py_gauss is None else float(py_gauss),
        "numpy_keys": torch.from_numpy(np_keys.astype(np.int64)),
        "numpy_pos": int(np_pos),
        "numpy_has_gauss": int(np_has_gauss),
        "numpy_gauss": float(np_gauss),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    gauss = None if state["python_gauss"] == -1.0 else state["python_gauss"]
    random.setstate((3, tuple(int(x) for x in state["python"].tolist()), gauss))
    np.random.set_state(
        (
            "MT19937",
            state["numpy_keys"].numpy().astype(np.uint32),
            state["numpy_pos"],
            state["numpy_has_gauss"],
            state["numpy_gauss"],
        )
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def restore_generator(generator: torch.Generator, state: torch.Tensor, source: Path | str, stream: str) -> None:
    """Give ``generator`` the state ``stream`` a checkpoint saved (a CPU byte tensor, whatever the generator's
    device); a state of another device kind's generator (a run written on a GPU resumed on a CPU, or the reverse) is
    a one-line error naming ``source``, not a size mismatch traceback."""
    try:
        generator.set_state(state)
    except RuntimeError as e:
        raise RiptError(f"{source}: its random stream {stream} was saved by a generator of another device kind than "
                        f"this run's ({generator.device.type}); resume it on the kind of device it was written "
                        f"on") from e
