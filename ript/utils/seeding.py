"""Seeding and RNG-state capture, so a resumed run continues the same random streams."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


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
