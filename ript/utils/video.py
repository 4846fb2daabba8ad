from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def write_mp4(path: Path, frames: list[np.ndarray], fps: int = 30) -> None:
    """Write (H, W, 3) uint8 frames to an mp4 atomically (imageio-ffmpeg ships its own ffmpeg)."""
    import imageio

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}.mp4")
    imageio.mimwrite(tmp, [np.asarray(f) for f in frames], fps=fps, macro_block_size=1)
    os.replace(tmp, path)
