"""Metric logging: TensorBoard by default, Weights & Biases optional. Metric names are grouped
(``train/...``, ``eval/...``, ``time/...``)."""

from __future__ import annotations

import logging
import sys
import uuid
from pathlib import Path
from typing import Any

log = logging.getLogger("ript")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of the call, not when the handler was made."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def setup_console_logging(level: int = logging.INFO) -> None:
    if not log.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s ript] %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False


class MetricLogger:
    """Writes scalars to TensorBoard (``<run_dir>/tb``) and, if enabled, to W&B under a stable run id."""

    def __init__(self, run_dir: Path, cfg: dict[str, Any], run_id: str | None = None, enabled: bool = True):
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self._tb = None
        self._wandb = None
        if not enabled:
            return
        logger_cfg = cfg.get("logger", {})
        if logger_cfg.get("tensorboard", True):
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(Path(run_dir) / "tb"))
        if logger_cfg.get("wandb", False):
            import wandb  # optional extra

            self._wandb = wandb.init(
                project=logger_cfg.get("project", "ript"),
                id=self.run_id,
                resume="allow",
                dir=str(run_dir),
                config=cfg,
                mode=logger_cfg.get("wandb_mode", "online"),
            )

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self._tb is not None:
            for k, v in metrics.items():
                self._tb.add_scalar(k, float(v), step)
        if self._wandb is not None:
            self._wandb.log(dict(metrics), step=step)

    def log_videos(self, paths: list[Path], tag: str, step: int) -> None:
        """mp4 files to W&B, and to TensorBoard as animated GIFs in its image panel (its video helper needs
        moviepy, which ript does not install); the mp4s stay in the run folder."""
        if self._tb is not None and paths:
            from tensorboard.compat.proto.summary_pb2 import Summary

            from ript.utils.video import mp4_to_gif

            for i, path in enumerate(paths):
                gif, height, width = mp4_to_gif(path)
                image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=gif)
                # the writer's own file writer, as its add_image and add_video use
                self._tb._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=f"{tag}/{i}", image=image)]),
                                                        step)
        if self._wandb is not None and paths:
            import wandb

            self._wandb.log({tag: [wandb.Video(str(p), format="mp4") for p in paths]}, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
