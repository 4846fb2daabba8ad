"""How well a world model stands in for the simulator, measured on demonstrations it did not train on: the
fidelity of its frames and robot state over an imagined horizon against the real ones for the same actions (PSNR,
SSIM, the error on the pixels that moved, the state's error; beside "nothing moves", the floor any model must beat,
and the model fed other actions, which shows whether it follows the actions at all), its success head's precision
and recall (on real frames, as trained, and on its own imagined ones), imagined env steps per second, and
side-by-side videos."""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ript.data.dataset import ChunkDataset, DatasetSpec
from ript.models.world_model import MOVED_LEVELS, WorldModel
from ript.utils.video import write_mp4


def demo_dataset(config: dict, horizon_chunks: int, split: str, files: list[Path] | None = None) -> ChunkDataset:
    """The split of the world model's own data files (the same demos held out as in its training), or of other
    ``files`` of its tasks, each sample with ``horizon_chunks`` chunks of actions and the real frames after each;
    task ids are the world model's."""
    cfg, kwargs = config["cfg"], config["model_kwargs"]
    chunk = int(kwargs["chunk"])
    files = files or [Path(f) for f in config["metadata"]["files"]]
    spec = DatasetSpec(files=files, obs_keys=dict(cfg["task"]["obs_keys"]),
                       chunk_size=chunk * horizon_chunks, action_dim=int(kwargs["action_dim"]),
                       demos_per_task=cfg["data"]["demos_per_task"], val_fraction=float(cfg["data"]["val_fraction"]),
                       seed=int(cfg["seed"]), flip_keys=tuple(cfg["task"]["flip_obs_keys"]),
                       action_key=str(cfg["data"]["action_key"]), future_every=chunk, future_count=horizon_chunks)
    dataset = ChunkDataset(spec, split)
    # a dataset numbers its tasks in the order of its files; other files may hold fewer tasks, or another order
    model_tasks = list(config["metadata"]["task_names"])
    dataset.task_ids = torch.tensor([model_tasks.index(n) for n in dataset.task_names])[dataset.task_ids]
    return dataset


def segment_starts(dataset: ChunkDataset, per_demo: int) -> torch.Tensor:
    """``per_demo`` evenly spaced start frames in each demo (its first frame first)."""
    starts = dataset.episode_start.unique()
    ends = dataset.episode_end[starts]
    offsets = torch.linspace(0, 1, per_demo + 1, device=starts.device)[:-1]
    picked = (starts[:, None] + (offsets[None] * (ends - starts)[:, None]).long()).flatten()
    return picked.unique()


def psnr(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-image PSNR (dB) of uint8-range float images (B, C, H, W)."""
    mse = (a - b).pow(2).mean(dim=(1, 2, 3)).clamp(min=1e-3)
    return 10 * torch.log10(255.0**2 / mse)


def ssim(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-image SSIM of uint8-range float images (B, C, H, W): an 11-pixel Gaussian window (sigma 1.5), the
    constants of Wang et al. 2004, averaged over channels and positions."""
    x = torch.arange(11, dtype=a.dtype, device=a.device) - 5
    g = torch.exp(-x.pow(2) / (2 * 1.5**2))
    g = g / g.sum()
    window = (g[:, None] * g[None, :]).expand(a.shape[1], 1, 11, 11).contiguous()

    def blur(t: torch.Tensor) -> torch.Tensor:
        return F.conv2d(t, window, padding=5, groups=a.shape[1])

    mu_a, mu_b = blur(a), blur(b)
    var_a, var_b, cov = blur(a * a) - mu_a**2, blur(b * b) - mu_b**2, blur(a * b) - mu_a * mu_b
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    s = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return s.mean(dim=(1, 2, 3))


def images_of(model: WorldModel, obs: dict[str, torch.Tensor]) -> torch.Tensor:
    """A batch's cameras side by side as uint8-range floats (B, 3, H, cameras * W)."""
    return torch.cat([obs[k].permute(0, 3, 1, 2).float() for k in model.image_keys], dim=3)


class Counts:
    """True/false positives and negatives of the success head."""

    def __init__(self):
        self.tp = self.fp = self.fn = self.tn = 0

    def add(self, predicted: torch.Tensor, actual: torch.Tensor, counted: torch.Tensor) -> None:
        p, a = predicted[counted], actual[counted]
        self.tp += int((p & a).sum())
        self.fp += int((p & ~a).sum())
        self.fn += int((~p & a).sum())
        self.tn += int((~p & ~a).sum())

    def summary(self) -> dict[str, float]:
        return {"precision": self.tp / max(1, self.tp + self.fp), "recall": self.tp / max(1, self.tp + self.fn),
                "positives": self.tp + self.fn, "negatives": self.fp + self.tn, "true_positives": self.tp,
                "false_positives": self.fp}


# the success thresholds a world model's head is scored at (environment.success_threshold picks one)
THRESHOLDS = tuple(round(0.05 * i, 2) for i in range(1, 20))


def threshold_curve(probs: torch.Tensor, labels: torch.Tensor, thresholds=THRESHOLDS) -> dict:
    """The success head's precision, recall and F1 at each threshold over these chunk ends (``labels``: the
    episode ended there with success), and the threshold of the best F1, the lowest of equals: the
    ``environment.success_threshold`` at which this model ends imagined episodes most like the real ones."""
    rows, every = [], torch.ones_like(labels)
    for threshold in thresholds:
        counts = Counts()
        counts.add(probs >= threshold, labels, every)
        summary = counts.summary()
        precision, recall = summary["precision"], summary["recall"]
        f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
        rows.append({"threshold": threshold, "precision": precision, "recall": recall, "f1": f1})
    best = max(rows, key=lambda row: row["f1"])  # the first of equals: the lowest threshold
    return {"curve": rows, "best_threshold": best["threshold"], "best_f1": best["f1"]}


# each imagined frame is scored against the real one after the same actions, beside two references: the first
# frame held ("still", the floor any model must beat) and the model fed another segment's actions ("other
# actions": as good as with the real actions when the model ignores what it is told to do)
SCORES = ("psnr", "ssim", "moved_error", "state_rmse")
REFERENCES = ("", "_still", "_other_actions")


def state_rmse(model: WorldModel, a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> torch.Tensor:
    """Root mean square difference of two observations' normalised robot states (zeros without a state)."""
    if not model.lowdim_keys:
        return torch.zeros(len(next(iter(a.values()))), device=model.action_normalizer.scale.device)
    return (model.normalized_state(a) - model.normalized_state(b)).pow(2).mean(-1).sqrt()


def moved_error(imagined: torch.Tensor, real: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """Mean absolute error (of 255) over the pixels that moved in the real frames since the start: whole-frame
    scores are dominated by the still scene, this one by the arm (0 where nothing moved)."""
    moved = (real - first).abs().amax(dim=1, keepdim=True) > MOVED_LEVELS
    error = ((imagined - real).abs() * moved).sum(dim=(1, 2, 3))
    return error / (3 * moved.sum(dim=(1, 2, 3))).clamp(min=1)


def scored(model: WorldModel, predicted: dict[str, torch.Tensor], predicted_images: torch.Tensor,
           real: dict[str, torch.Tensor], real_images: torch.Tensor, first_images: torch.Tensor
           ) -> dict[str, torch.Tensor]:
    """Every score of ``SCORES`` of one prediction (each observation with its cameras as ``images_of`` lays them)."""
    return {"psnr": psnr(predicted_images, real_images), "ssim": ssim(predicted_images, real_images),
            "moved_error": moved_error(predicted_images, real_images, first_images),
            "state_rmse": state_rmse(model, predicted, real)}


@torch.no_grad()
def imagined_segments(model: WorldModel, dataset: ChunkDataset, starts: torch.Tensor, threshold: float,
                      device: str, batch_size: int = 64, n_videos: int = 0, video_dir: Path | None = None) -> dict:
    """Open-loop imagination from real frames with the episodes' own actions: each of ``SCORES`` per chunk of
    horizon, for the model and for the ``REFERENCES``, and the success head on the imagined frames, at
    ``threshold`` and over the thresholds of ``threshold_curve``."""
    horizon = dataset.spec.future_count
    sums = {k + ref: torch.zeros(horizon, dtype=torch.float64) for k in SCORES for ref in REFERENCES}
    sums["n"] = torch.zeros(horizon, dtype=torch.float64)
    videos, probs, labels = 0, [], []
    for i in range(0, len(starts), batch_size):
        segments = starts[i:i + batch_size]
        batch = dataset.get_batch(segments)
        # frames left in each segment's episode: a failed one stops at its time limit, with nothing real after it
        left = (dataset.episode_end[segments] - segments).to(device)
        first = {k: v[:, 0].to(device) for k, v in batch["obs"].items()}
        first_images = images_of(model, first)
        obs, other_obs = first, first
        live = torch.ones(len(batch["task_ids"]), dtype=torch.bool, device=device)
        task_ids, actions = batch["task_ids"].to(device), batch["actions"].to(device)
        other_actions = actions.roll(1, dims=0)  # the previous segment's (one segment alone keeps its own)
        frames: list[tuple[torch.Tensor, torch.Tensor]] = []
        for n in range(horizon):
            span = slice(n * model.chunk, (n + 1) * model.chunk)
            obs, prob = model.step(obs, task_ids, actions[:, span])
            other_obs, _ = model.step(other_obs, task_ids, other_actions[:, span])
            real = {k: v[:, n].to(device) for k, v in batch["future_obs"].items()}
            real_images, imagined_images = images_of(model, real), images_of(model, obs)
            done = batch["future_done"][:, n].to(device)
            in_episode = (n + 1) * model.chunk < left
            live = live & (in_episode | done)
            compared = (("", obs, imagined_images), ("_still", first, first_images),
                        ("_other_actions", other_obs, images_of(model, other_obs)))
            for ref, predicted, predicted_images in compared:
                for name, value in scored(model, predicted, predicted_images, real, real_images, first_images).items():
                    sums[name + ref][n] += float(value[live].sum())
            sums["n"][n] += float(live.sum())
            probs.append(prob[live].float().cpu())
            labels.append(done[live].bool().cpu())
            frames.append((real_images, imagined_images))
            live = live & in_episode
        for j in range(min(len(task_ids), n_videos - videos)):
            side = [torch.cat([r[j], m[j]], dim=1).permute(1, 2, 0).byte().cpu().numpy() for r, m in frames]
            write_mp4(video_dir / f"segment{videos:03d}_real_top_imagined_below.mp4", side)
            videos += 1
    n = sums.pop("n").clamp(min=1)
    table = [{"chunks": h + 1, **{k: float(v[h] / n[h]) for k, v in sums.items()}, "segments": int(n[h])}
             for h in range(horizon)]
    # every live chunk end's head probability and whether it ended the episode: the head at ``threshold`` and
    # over the calibration's thresholds, counted from the same lists
    probs, labels = torch.cat(probs), torch.cat(labels)
    head = Counts()
    head.add(probs >= threshold, labels, torch.ones_like(labels))
    return {"fidelity": table, "head_on_imagined": head.summary(), "head_calibration": threshold_curve(probs, labels)}


@torch.no_grad()
def head_on_real(model: WorldModel, dataset: ChunkDataset, threshold: float, device: str,
                 batch_size: int = 256) -> dict[str, float]:
    """The success head on every real frame of the split with the chunk that followed it, as it was trained."""
    counts = Counts()
    for i in range(0, len(dataset), batch_size):
        batch = dataset.get_batch(torch.arange(i, min(i + batch_size, len(dataset)), device=dataset.device))
        obs = {k: v[:, 0].to(device) for k, v in batch["obs"].items()}
        _, prob = model.step(obs, batch["task_ids"].to(device), batch["actions"][:, :model.chunk].to(device))
        done = batch["future_done"][:, 0].to(device)
        counts.add(prob >= threshold, done, torch.ones_like(done))
    return counts.summary()


@torch.no_grad()
def imagined_steps_per_second(model: WorldModel, dataset: ChunkDataset, envs: int, chunks: int,
                              device: str) -> dict[str, float]:
    """Env steps per second of ``envs`` imagined envs stepping ``chunks`` chunks of the demos' actions (the
    model alone: no policy)."""
    batch = dataset.get_batch(torch.arange(envs, device=dataset.device) % len(dataset))
    obs = {k: v[:, 0].to(device) for k, v in batch["obs"].items()}
    return timed_steps(model, obs, batch["task_ids"].to(device), batch["actions"][:, :model.chunk].to(device),
                       chunks, device)


@torch.no_grad()
def timed_steps(model: WorldModel, obs: dict[str, torch.Tensor], task_ids: torch.Tensor, actions: torch.Tensor,
                chunks: int, device: str, warmup: int = 1) -> dict[str, float]:
    """``chunks`` steps of a batch of envs, timed after ``warmup`` untimed ones (a GPU picks its kernels)."""
    for _ in range(warmup):
        model.step(obs, task_ids, actions)
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(chunks):
        obs, _ = model.step(obs, task_ids, actions)
    synchronize(device)
    seconds = time.perf_counter() - t0
    envs = len(task_ids)
    return {"envs": envs, "env_steps": envs * chunks * model.chunk, "seconds": seconds,
            "env_steps_per_second": envs * chunks * model.chunk / max(seconds, 1e-9),
            "ms_per_step_of_all_envs": 1000 * seconds / chunks}


def synchronize(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def fidelity_table(results: dict) -> str:
    """Per chunk of horizon, each score three times: the model with the real actions, still, other actions."""
    names = {"psnr": ("PSNR (dB)", "{:.2f}"), "ssim": ("SSIM", "{:.3f}"), "moved_error": ("moved px error", "{:.1f}"),
             "state_rmse": ("state RMSE", "{:.3f}")}
    rows = ["        " + "  ".join(f"{title:^20}" for title, _ in names.values()),
            "chunks  " + "  ".join(f"{'model  still  other':>20}" for _ in names) + "  segments"]
    for r in results["fidelity"]:
        cells = ["{:>6} {:>6} {:>6}".format(*(form.format(r[key + ref]) for ref in REFERENCES))
                 for key, (_, form) in names.items()]
        rows.append(f"{r['chunks']:>6}  " + "  ".join(cells) + f"  {r['segments']:>8}")
    return "\n".join(rows)


def head_line(name: str, counts: dict) -> str:
    return (f"success head on {name}: precision {100 * counts['precision']:.1f}%, recall {100 * counts['recall']:.1f}% "
            f"({counts['positives']} finishing chunks, {counts['negatives']} others)")

