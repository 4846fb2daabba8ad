"""``ript world-model-eval``: how well a world model stands in for the simulator, on the demos it held out
(``ript.evaluation.imagination``), or on every episode of another folder of its tasks (``episodes_dir``: a
policy's own, as ``ript eval record_episodes=true`` records them): frame fidelity per chunk of an imagined
horizon, the success head's precision and recall on real and imagined frames, imagined env steps per second,
side-by-side videos; ``results.json``.

    ript world-model-eval checkpoint=runs/libero_object/world_model
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ript.config import extra_data_files
from ript.evaluation.imagination import (
    demo_dataset,
    fidelity_table,
    head_line,
    head_on_real,
    imagined_segments,
    imagined_steps_per_second,
    segment_starts,
)
from ript.evaluation.results import results_dir
from ript.model_loader import load_model
from ript.utils.atomic import atomic_write_text
from ript.utils.device import resolve_device
from ript.utils.locking import holding
from ript.utils.logging import log, setup_console_logging


def run(cfg) -> dict[str, Any]:
    setup_console_logging()
    device = resolve_device(cfg.device)
    model, config = load_model(cfg.checkpoint, expect_stage="world_model", device=device)
    model.eval()
    if cfg.denoise_steps is not None:
        model.set_denoise_steps(int(cfg.denoise_steps))
    ckpt = Path(config["checkpoint_dir"])
    out_dir = Path(cfg.out_dir) if cfg.out_dir else ckpt.parent.parent / "world_model_eval" / ckpt.name
    # another folder's episodes are checked before anything is written, and measured whole
    episodes = (extra_data_files(list(model.task_names), [cfg.episodes_dir], "episodes_dir") if cfg.episodes_dir
                else None)
    split = "all" if episodes else str(cfg.split)
    with holding(out_dir, "out_dir"):
        results_dir(out_dir, bool(cfg.overwrite))
        dataset = demo_dataset(config, int(cfg.horizon_chunks), split, episodes)
        dataset.to(device)
        threshold = float(cfg.success_threshold)
        torch.manual_seed(int(cfg.seed))
        results = {"checkpoint": str(ckpt), "split": split, "episodes_dir": cfg.episodes_dir,
                   "demos": dataset.num_demos, "successful_demos": int(dataset.episode_success[
                       dataset.episode_start.unique()].sum()),
                   "chunk": model.chunk, "success_threshold": threshold, "denoise_steps": model.sampling_steps,
                   **imagined_segments(model, dataset, segment_starts(dataset, int(cfg.starts_per_demo)), threshold,
                                       device, n_videos=int(cfg.n_videos), video_dir=out_dir / "videos"),
                   "head_on_real": head_on_real(model, dataset, threshold, device),
                   "speed": imagined_steps_per_second(model, dataset, int(cfg.speed_envs), int(cfg.speed_chunks),
                                                      device)}
        atomic_write_text(out_dir / "results.json", json.dumps(results, indent=2))
    print(fidelity_table(results))
    print(head_line("real frames", results["head_on_real"]))
    print(head_line("imagined frames", results["head_on_imagined"]))
    calibration = results["head_calibration"]
    print(f"success head on imagined frames: best F1 {calibration['best_f1']:.2f} at threshold "
          f"{calibration['best_threshold']:g} (environment.success_threshold; {threshold:g} above)")
    speed = results["speed"]
    print(f"imagined: {speed['env_steps_per_second']:.0f} env steps/s ({speed['envs']} envs on {device})")
    log.info("world-model-eval: results in %s", out_dir / "results.json")
    return results
