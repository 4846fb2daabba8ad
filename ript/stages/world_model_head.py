"""``ript world-model-head``: a world model's success head trained again on the model's own imagination.

The head learns on real frames and is read in RL on imagined ones, which drift over an episode of tens of chunks: on
LIBERO-Object it fired in none of the imagined episodes of 8 of its 10 tasks, whose real episodes mostly succeeded
(docs/world_model.md). Here every episode of the world model's data (its training split: the demos and the policy
episodes it learnt from, and the folders ``episodes_dirs`` adds) is imagined again from its first real frame with its
own recorded actions, open loop to its end, as RL's episodes run from their first frame; and the head alone learns
(the dynamics stay as they are) from what it reads at each imagined chunk. The last chunk of a successful episode is
a success; every chunk of a failed episode is not, nor is a successful one's chunk before its last ``ignore_chunks``
+ 1 (imagined timing can drift by a chunk or so around the real end; those few count neither way). A success weighs
what it did when the world model learnt (``algo.model.success_weight``), so that the head's probabilities keep their
scale and ``environment.success_threshold`` its meaning. The same measures on the held-out split, before and after,
go to ``success_head.json``: per chunk, precision and recall at 0.5; per episode, whether its highest probability
reaches a threshold, against its real outcome (balanced accuracy at 0.5 and at its best threshold).

    ript world-model-head checkpoint=runs/x/world_model run_dir=runs/x/world_model_head
    ript rl ... environment=world_model environment.checkpoint=runs/x/world_model_head
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ript.config import extra_data_files
from ript.data.dataset import ChunkDataset, EmptySplitError
from ript.errors import RiptError
from ript.evaluation.calibration import threshold_row, threshold_scan
from ript.evaluation.imagination import Counts, demo_dataset
from ript.model_loader import load_model
from ript.models.world_model import WorldModel
from ript.utils.atomic import atomic_write_text
from ript.utils.checkpoint import save_checkpoint
from ript.utils.device import resolve_device
from ript.utils.locking import LOCK_FILE, holding
from ript.utils.logging import log, setup_console_logging
from ript.utils.seeding import seed_everything

RESULTS_FILE = "success_head.json"


@dataclass
class ImaginedChunks:
    """Every imagined chunk of a set of episodes: what the success head reads there, and how it is labelled."""
    features: torch.Tensor  # (N, F)
    labels: torch.Tensor    # (N,) bool: the chunk ends a successful episode
    counted: torch.Tensor   # (N,) bool: False just before a successful episode's last chunk
    episode: torch.Tensor   # (N,) long: the episode it belongs to
    success: torch.Tensor   # (E,) bool: each episode's real outcome


@torch.no_grad()
def imagine_episodes(model: WorldModel, dataset: ChunkDataset, device: str, episodes_per_batch: int,
                     ignore_chunks: int) -> ImaginedChunks:
    """Each episode of ``dataset`` imagined from its first frame with its own actions, to its end, open loop; each
    step through the observations a policy reads (as RL's imagination steps)."""
    starts = dataset.episode_start.unique()
    ends, success = dataset.episode_end[starts], dataset.episode_success[starts]
    chunk, parts = model.chunk, []
    for i in range(0, len(starts), episodes_per_batch):
        s, e, won = starts[i:i + episodes_per_batch], ends[i:i + episodes_per_batch], success[i:i + episodes_per_batch]
        chunks = (e - s + chunk - 1) // chunk
        obs = {k: v[s].to(device) for k, v in dataset.obs.items()}
        task_ids = dataset.task_ids[s].to(device)
        for r in range(int(chunks.max())):
            positions = s[:, None] + r * chunk + torch.arange(chunk)
            actions = dataset.actions[torch.minimum(positions, e[:, None] - 1)].to(device)
            images, state = model.encode_observation(obs)
            with torch.autocast("cuda", torch.bfloat16, enabled=images.is_cuda):
                out = model.predict(images, state, task_ids, actions)
            live, last = r < chunks, r == chunks - 1
            near_end = won & ~last & (r >= chunks - 1 - ignore_chunks)
            parts.append((out.head_in.float().cpu()[live], (won & last)[live], ~near_end[live],
                          (i + torch.arange(len(s)))[live]))
            obs = model.decode_observation(out)
    features, labels, counted, episode = (torch.cat(p) for p in zip(*parts))
    return ImaginedChunks(features, labels, counted, episode, success.cpu())


def train_head(head: torch.nn.Module, chunks: ImaginedChunks, success_weight: float, steps: int, batch_size: int,
               lr: float, seed: int, device: str) -> list[float]:
    """The head trained on the counted chunks, a success weighing ``success_weight`` failures; the mean loss of
    each tenth of the steps."""
    x, y = chunks.features[chunks.counted].to(device), chunks.labels[chunks.counted].float().to(device)
    positives = int(y.sum())
    if positives == 0 or positives == len(y):
        raise RiptError(f"world-model-head: the training episodes hold {'no' if positives == 0 else 'only'} "
                        f"successful chunks; the head needs successes and failures to learn from")
    pos_weight = torch.tensor(float(success_weight), device=device)
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=1e-4)
    generator = torch.Generator().manual_seed(seed)
    losses, tenth = [], torch.zeros((), device=device)
    head.train()
    for step in range(steps):
        pick = torch.randint(len(y), (batch_size,), generator=generator).to(device)
        logits = head(x[pick]).squeeze(-1)
        loss = F.binary_cross_entropy_with_logits(logits, y[pick], pos_weight=pos_weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        tenth += loss.detach()
        if (step + 1) % max(1, steps // 10) == 0:
            losses.append(round(float(tenth) / max(1, steps // 10), 4))
            tenth.zero_()
    head.eval()
    return losses


@torch.no_grad()
def head_measures(head: torch.nn.Module, chunks: ImaginedChunks, device: str, threshold: float = 0.5
                  ) -> dict[str, Any]:
    """The head on these imagined chunks: per chunk, precision and recall at ``threshold``; per episode, its
    highest probability against its real outcome, at ``threshold`` and at the threshold of best balanced accuracy."""
    probs = torch.sigmoid(head(chunks.features.to(device)).squeeze(-1).float()).cpu()
    counts = Counts()
    counts.add(probs >= threshold, chunks.labels, chunks.counted)
    peak = torch.zeros(len(chunks.success)).scatter_reduce(0, chunks.episode, probs, "amax", include_self=False)
    won, peak = chunks.success.numpy(), peak.numpy()
    at = threshold_row(threshold, peak >= threshold, won)
    _, best = threshold_scan(peak, won)  # chosen as calibrate chooses it
    return {"chunks": counts.summary(), "episodes": len(won), "successful_episodes": int(won.sum()),
            "episode_balanced_accuracy": at["balanced_accuracy"], "episode_best": best,
            "mean_peak": {"successes": float(np.mean(peak[won])) if won.any() else None,
                          "failures": float(np.mean(peak[~won])) if (~won).any() else None}}


def measure_line(name: str, m: dict[str, Any]) -> str:
    best = m["episode_best"]
    return (f"{name}: chunks precision {m['chunks']['precision']:.1%} recall {m['chunks']['recall']:.1%} at 0.5; "
            f"{m['episodes']} episodes ({m['successful_episodes']} successful): balanced accuracy "
            f"{m['episode_balanced_accuracy']:.1%} at 0.5, {best['balanced_accuracy']:.1%} at {best['threshold']:g}")


def run_folder_ready(run_dir: Path, resume: bool) -> bool:
    """Whether the head is still to be trained in ``run_dir``: False when it holds its checkpoint and ``resume``
    (a finished run, as a protocol asks again), refused when it holds anything without ``resume``."""
    if (run_dir / "checkpoints" / "last").exists():
        if resume:
            return False
        raise RiptError(f"run_dir {run_dir} holds a world model already; choose another run_dir")
    if run_dir.exists() and not resume and any(p.name != LOCK_FILE for p in run_dir.iterdir()):
        raise RiptError(f"run_dir {run_dir} already exists; pass resume=true to finish it or choose another run_dir")
    return True


def splits(config: dict[str, Any], files: list[Path]) -> tuple[ChunkDataset, ChunkDataset | None]:
    train = demo_dataset(config, 1, "train", files)
    try:
        return train, demo_dataset(config, 1, "val", files)
    except EmptySplitError:  # so few episodes that none is held out: nothing to measure on
        return train, None


def run(cfg) -> dict[str, Any]:
    setup_console_logging()
    device = resolve_device(cfg.device)
    seed_everything(int(cfg.seed))
    model, config = load_model(cfg.checkpoint, expect_stage="world_model", device=device)
    model.eval().requires_grad_(False)
    if cfg.denoise_steps is not None:  # the head learns the frames drawn so, and the model keeps drawing them so
        model.set_denoise_steps(int(cfg.denoise_steps))
        config = {**config, "model_kwargs": {**config["model_kwargs"], "denoise_steps": int(cfg.denoise_steps)}}
    run_dir, source = Path(cfg.run_dir), Path(config["checkpoint_dir"])
    extra = extra_data_files(list(model.task_names), list(cfg.episodes_dirs), "episodes_dirs")
    files = [Path(f) for f in config["metadata"]["files"]] + extra
    with holding(run_dir, "run_dir"):
        if not run_folder_ready(run_dir, bool(cfg.resume)):
            log.info("world-model-head: %s holds its world model already", run_dir)
            return json.loads((run_dir / RESULTS_FILE).read_text())
        train_set, val_set = splits(config, files)
        imagine = dict(device=device, episodes_per_batch=int(cfg.episodes_per_batch),
                       ignore_chunks=int(cfg.ignore_chunks))
        train_chunks = imagine_episodes(model, train_set, **imagine)
        val_chunks = imagine_episodes(model, val_set, **imagine) if val_set is not None else None
        held_out = {"before": head_measures(model.success_head, val_chunks, device)} if val_chunks else {}
        model.success_head.requires_grad_(True)
        losses = train_head(model.success_head, train_chunks, model.success_weight, int(cfg.steps),
                            int(cfg.batch_size), float(cfg.lr), int(cfg.seed), device)
        model.success_head.requires_grad_(False)
        if val_chunks:
            held_out["after"] = head_measures(model.success_head, val_chunks, device)
        results = {"source": str(source), "episodes": {"train": int(len(train_chunks.success)),
                                                       "held_out": int(len(val_chunks.success)) if val_chunks else 0},
                   "imagined_chunks": int(len(train_chunks.labels)), "losses": losses, "held_out": held_out,
                   "settings": {k: cfg[k] for k in ("steps", "batch_size", "lr", "ignore_chunks", "seed")}
                   | {"denoise_steps": model.sampling_steps},
                   "episodes_dirs": list(cfg.episodes_dirs)}
        metadata = {**config["metadata"], "success_head": {k: v for k, v in results.items() if k != "losses"}}
        saved = {k: v for k, v in config.items() if k not in ("checkpoint_dir", "step")}
        ckpt = save_checkpoint(run_dir, int(source.name), model, {**saved, "metadata": metadata})
        atomic_write_text(run_dir / RESULTS_FILE, json.dumps(results, indent=2))
    for when, measured in held_out.items():
        print(measure_line(f"success head on the held-out episodes' imagined chunks, {when}", measured))
    log.info("world-model-head: the world model with its new head in %s", ckpt)
    return results
