"""Episode videos: mp4 files, and GIFs of them for TensorBoard."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

log = logging.getLogger("ript")  # the package's logger, set up by ript.utils.logging (which imports this module)


def write_mp4(path: Path, frames: list[np.ndarray], fps: int = 30) -> bool:
    """Write (H, W, 3) uint8 frames to an mp4 atomically. Uses imageio-ffmpeg (which ships ffmpeg), else
    OpenCV; with neither, logs a warning and writes nothing. Returns whether a file was written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}.mp4")
    frames = [np.ascontiguousarray(f, dtype=np.uint8) for f in frames]
    try:
        import imageio
        import imageio_ffmpeg  # noqa: F401  (imageio picks its ffmpeg plugin only when this is present)

        imageio.mimwrite(tmp, frames, fps=fps, macro_block_size=1, format="FFMPEG")
    except ImportError:
        try:
            import cv2
        except ImportError:
            log.warning("no video written to %s: install imageio-ffmpeg", path)
            return False
        h, w = frames[0].shape[:2]
        writer = cv2.VideoWriter(str(tmp), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
        for f in frames:
            writer.write(f[:, :, ::-1])  # OpenCV wants BGR
        writer.release()
    os.replace(tmp, path)
    return True


def mp4_to_gif(path: Path, max_frames: int = 120, fps: int = 15) -> tuple[bytes, int, int]:
    """An mp4 as an animated GIF (what TensorBoard's image panel plays, with no moviepy), keeping every k-th frame
    so at most ``max_frames`` remain. Returns (GIF bytes, height, width)."""
    import io

    import imageio
    import imageio_ffmpeg  # noqa: F401  (imageio's ffmpeg plugin)
    from PIL import Image

    frames = imageio.mimread(str(path), format="FFMPEG", memtest=False)
    step = max(1, -(-len(frames) // max_frames))
    images = [Image.fromarray(np.asarray(f, dtype=np.uint8)) for f in frames[::step]]
    buf = io.BytesIO()
    images[0].save(buf, format="GIF", save_all=True, append_images=images[1:], duration=max(20, 1000 // fps), loop=0)
    return buf.getvalue(), images[0].height, images[0].width
