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


def take_peak_memory_gib(device: str) -> dict[str, float]:
    """The most GPU memory this process's tensors held since the last call (``memory/peak_gib``; the allocator's
    cache on top: ``memory/reserved_gib``), the peak then reset; nothing on the CPU."""
    import torch

    if not device.startswith("cuda"):
        return {}
    peak = {"memory/peak_gib": torch.cuda.max_memory_allocated(device) / 2**30,
            "memory/reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30}
    torch.cuda.reset_peak_memory_stats(device)
    return peak
