"""Which device a job computes on."""

from __future__ import annotations

from ript.errors import RiptError


def resolve_device(device: str) -> str:
    """``auto``: CUDA when there is a GPU, else the CPU; a CUDA device asked for without one is a RiptError."""
    import torch  # here: the CLI composes and checks configs without loading torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RiptError(f"device={device!r} but CUDA is not available")
    return device
