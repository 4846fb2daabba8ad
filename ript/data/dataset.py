"""Windows of future actions and stacked observations over demonstration files, held in memory.

Every demo frame ``t`` is one sample: observations ``t-frame_stack+1 .. t`` (repeating the first frame at
an episode start) and actions ``t .. t+chunk-1`` (repeating the last action past the end, with a mask); for a
world model, also the observations after every ``future_every`` of those actions (``future_obs``) and whether the
demo's last action was among them and finished it with success (``future_done``).
All demos are concatenated into tensors so a batch is a few vectorised gathers, on CPU or GPU.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from ript.data.hdf5 import instruction_from_attrs, read_file_attrs
from ript.data.loading import load_split
from ript.envs.suites import task_horizon
from ript.errors import RiptError


@dataclass
class DatasetSpec:
    files: list[Path]
    obs_keys: dict[str, str]  # canonical key -> key in the file
    chunk_size: int
    frame_stack: int = 1
    action_dim: int | None = None
    demos_per_task: int | None = None
    val_fraction: float = 0.1
    seed: int = 0
    flip_keys: tuple[str, ...] = ()
    load_workers: int | None = None  # processes reading the files (None: by size, see ript.data.loading)
    action_key: str = "actions"       # the per-demo dataset learnt as the actions (hdf5.EXPERT_ACTIONS: noise-free)
    future_every: int = 0             # with future_count: the observation after every this many actions ...
    future_count: int = 0             # ... this many times (a world model's targets; 0: none)


class EmptySplitError(RiptError):
    """A split has no demos (e.g. too few demos per task to hold any out for validation)."""


class ChunkDataset:
    def __init__(self, spec: DatasetSpec, split: str = "train"):
        if split not in ("train", "val", "all"):
            raise ValueError(split)
        self.spec = spec
        self.task_names: list[str] = []   # each task once, in the order of its first file
        self.instructions: list[str] = []
        self.file_attrs: list[dict] = []
        task_of_file = []                 # a task's demos may come from several files (demos, recorded episodes)
        for path in spec.files:
            attrs = read_file_attrs(path)
            self.file_attrs.append(attrs)
            name = str(attrs.get("task_name", Path(path).stem))
            if name not in self.task_names:
                self.task_names.append(name)
                self.instructions.append(instruction_from_attrs(attrs, Path(path)))
            task_of_file.append(self.task_names.index(name))
        picks = [functools.partial(self._split_indices, split=split, task_id=t) for t in range(len(spec.files))]
        arrays = load_split(list(spec.files), spec.obs_keys, spec.demos_per_task, spec.action_dim, spec.flip_keys,
                            picks, spec.load_workers, spec.action_key)
        lengths = [n for layout in arrays.layouts for n in layout.lengths]
        if not lengths:
            raise EmptySplitError(f"the {split} split is empty (files: {', '.join(map(str, spec.files))})")
        task_of_demo = [task_of_file[t] for t, layout in enumerate(arrays.layouts) for _ in layout.lengths]
        successes = [ok for layout in arrays.layouts for ok in layout.successes]
        ends = np.cumsum(lengths)
        self.actions = torch.from_numpy(arrays.actions)
        self.obs = {k: torch.from_numpy(v) for k, v in arrays.obs.items()}
        self.task_ids = torch.from_numpy(np.repeat(task_of_demo, lengths)).long()
        self.episode_start = torch.from_numpy(np.repeat(ends - lengths, lengths)).long()
        self.episode_end = torch.from_numpy(np.repeat(ends, lengths)).long()
        self.episode_success = torch.from_numpy(np.repeat(successes, lengths)).bool()  # recorded episodes may fail
        self.num_demos = len(lengths)
        # what a resumed run compares: the same files with the same demos (a file re-collected with more demos,
        # or replaced, would silently change what the rest of the run trains on)
        self.fingerprint = [{"file": layout.path.name, "demos": len(layout.names), "samples": sum(layout.lengths),
                             "bytes": layout.path.stat().st_size} for layout in arrays.layouts]
        self._serve_device: torch.device | None = None  # batches delivered elsewhere than the storage (serve_to)
        self._steps_with_ahead: dict[tuple[int, torch.device], torch.Tensor] = {}  # state_steps' draws, per device

    def _split_indices(self, n: int, split: str, task_id: int) -> list[int]:
        """Split by demo, the same way every time for a given seed. A task with so few demos that its share
        rounds to none holds none out: a few-shot run trains on every demo it was given."""
        n_val = int(round(self.spec.val_fraction * n))
        if split == "all" or n_val == 0 or n < 2:
            return [] if split == "val" else list(range(n))
        perm = np.random.default_rng([self.spec.seed, task_id]).permutation(n)
        chosen = perm[:n_val] if split == "val" else perm[n_val:]
        return sorted(int(i) for i in chosen)

    def __len__(self) -> int:
        return len(self.actions)

    @property
    def device(self) -> torch.device:
        """Where batches are delivered (the storage's device unless ``serve_to`` chose another)."""
        return self._serve_device if self._serve_device is not None else self.actions.device

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.actions, *self.obs.values(), self.task_ids,
                                                         self.episode_start, self.episode_end, self.episode_success))

    def to(self, device: str | torch.device) -> ChunkDataset:
        """Move the whole dataset (and where batches are delivered) to ``device``."""
        self.actions = self.actions.to(device)
        self.obs = {k: v.to(device) for k, v in self.obs.items()}
        for name in ("task_ids", "episode_start", "episode_end", "episode_success"):
            setattr(self, name, getattr(self, name).to(device))
        self._serve_device = None
        return self

    @property
    def served(self) -> bool:
        """Whether batches are gathered in host memory and delivered elsewhere (``serve_to``)."""
        return self._serve_device is not None

    def serve_to(self, device: str | torch.device) -> ChunkDataset:
        """Keep the dataset in host memory and deliver each batch to ``device``: gathered on the host, copied
        from pinned memory without waiting (for datasets larger than the GPU's free memory)."""
        self._serve_device = torch.device(device)
        return self

    def get_batch(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        serve = self._serve_device
        if serve is not None:
            pin = serve.type == "cuda"

            def deliver(t: torch.Tensor) -> torch.Tensor:
                return (t.pin_memory() if pin else t).to(serve, non_blocking=True)

            batch = self._gather(idx.cpu())
            return {k: {n: deliver(t) for n, t in v.items()} if isinstance(v, dict) else deliver(v)
                    for k, v in batch.items()}
        if idx.device.type == "cpu" and self.device.type == "cuda":
            # pinned: a copy from pageable memory would wait for the GPU's queue to drain every step
            idx = idx.pin_memory().to(self.device, non_blocking=True)
        return self._gather(idx.to(self.device))

    def _gather(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """The batch of samples ``idx`` (on the storage's device)."""
        start, end = self.episode_start[idx, None], self.episode_end[idx, None]
        fs, chunk = self.spec.frame_stack, self.spec.chunk_size
        obs_idx = torch.maximum(idx[:, None] - torch.arange(fs - 1, -1, -1, device=idx.device), start)
        act_pos = idx[:, None] + torch.arange(chunk, device=idx.device)
        act_idx = torch.minimum(act_pos, end - 1)
        batch = {
            "obs": {k: v[obs_idx] for k, v in self.obs.items()},
            "actions": self.actions[act_idx],
            "action_mask": act_pos < end,
            "task_ids": self.task_ids[idx],
        }
        if self.spec.future_count:
            # the frame after a run of actions; past the demo's end, its last frame (the chunk that finished it)
            offsets = self.spec.future_every * torch.arange(1, self.spec.future_count + 1, device=idx.device)
            future = idx[:, None] + offsets
            batch["future_obs"] = {k: v[torch.minimum(future, end - 1)] for k, v in self.obs.items()}
            # a failed episode ends at its time limit, which is no state to predict: never "done"
            batch["future_done"] = (future >= end) & self.episode_success[idx, None]
        return batch

    def state_steps(self, count: int, ahead: int, keys: list[str], generator: torch.Generator
                    ) -> dict[str, torch.Tensor]:
        """``count`` steps drawn by ``generator`` from those with ``ahead`` more steps in their episode: the low-dim
        observations ``keys`` there (``obs``) and ``ahead`` steps later (``next_obs``), the actions between
        (count, ahead, A) and the task; no image is read (a world model's state network learns on many of them)."""
        storage = self.actions.device
        valid = self._steps_with_ahead.get((ahead, storage))
        if valid is None:  # found once: a boolean index waits for the GPU
            steps = torch.arange(len(self.actions), device=storage)
            valid = self._steps_with_ahead[(ahead, storage)] = steps[steps + ahead < self.episode_end]
        if not len(valid):
            raise RiptError(f"no episode of this split is longer than {ahead} steps")
        drawn = torch.randint(len(valid), (count,), generator=generator, device=generator.device)
        idx = valid[drawn.to(storage)]
        between = idx[:, None] + torch.arange(ahead, device=storage)
        batch = {"obs": {k: self.obs[k][idx] for k in keys}, "next_obs": {k: self.obs[k][idx + ahead] for k in keys},
                 "actions": self.actions[between], "task_ids": self.task_ids[idx]}
        return {k: {n: t.to(self.device) for n, t in v.items()} if isinstance(v, dict) else v.to(self.device)
                for k, v in batch.items()}

    def obs_shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v.shape[1:]) for k, v in self.obs.items()}

    def metadata(self, task_cfg=None) -> dict:
        """What a checkpoint needs to rebuild the evaluation env and read the same data again. Files not
        written by ript (official LIBERO data) lack the suite and render settings: ``task_cfg`` supplies them."""
        first = self.file_attrs[0]
        env_args = dict(first.get("env_args") or {})
        suite = first.get("suite")
        if task_cfg is not None:
            suite = suite or str(task_cfg.suite)
            env_args.setdefault("render", OmegaConf.to_container(task_cfg.render, resolve=True))
            env_args.setdefault("max_episode_steps", task_horizon(task_cfg))
        return {
            "suite": suite,
            "env_args": env_args,
            "task_names": self.task_names,
            "instructions": self.instructions,
            "files": [str(p) for p in self.spec.files],
            "num_demos": self.num_demos,
            "num_samples": len(self),
            "data": self.fingerprint,
            "reading": self.reading(),
        }

    def reading(self) -> dict:
        """What reads this split again from the same files (``reread_spec``; RL's demo term rebuilds it)."""
        spec = self.spec
        return {key: list(getattr(spec, key)) if key == "flip_keys" else getattr(spec, key) for key in READING}


# the DatasetSpec fields a checkpoint's ``metadata.reading`` records, beside its ``files``
READING = ("obs_keys", "chunk_size", "frame_stack", "action_dim", "demos_per_task", "val_fraction", "seed",
           "flip_keys", "action_key")


def reread_spec(metadata: dict) -> DatasetSpec:
    """The spec that read a checkpoint's training split (its metadata's ``files`` and ``reading``)."""
    reading = metadata["reading"]
    return DatasetSpec(files=[Path(f) for f in metadata["files"]],
                       **{key: tuple(reading[key]) if key == "flip_keys" else reading[key] for key in READING})


def check_resume_data(resume_from: Path | None, train_set: ChunkDataset, allowed_changes) -> None:
    """A resumed run trains on the data its checkpoint was trained on: the same files, demo counts and sizes
    (``resume_allow_changes=[data]`` continues anyway). Checkpoints that record no fingerprint pass."""
    from ript.utils.checkpoint import read_checkpoint_config

    if resume_from is None or "data" in [str(k) for k in allowed_changes or []]:
        return
    recorded = (read_checkpoint_config(resume_from).get("metadata") or {}).get("data")
    if recorded is None or recorded == train_set.fingerprint:
        return
    # file by file in the order read: the demos and a policy's recorded episodes of one task share a file name
    was, now = next((a, b) for a, b in itertools.zip_longest(recorded, train_set.fingerprint) if a != b)
    name = (now or was)["file"]

    def describe(d: dict | None) -> str:
        return "no such file" if d is None else f"{d['demos']} demos, {d['samples']} samples, {d['bytes']} bytes"

    raise RiptError(f"resume: {resume_from} was trained on {name} with {describe(was)}; it now has "
                    f"{describe(now)} (the training split); resuming would train on other data. Restore "
                    f"the data, choose another run_dir, or pass resume_allow_changes=[data] to continue anyway")


def batch_indices(n: int, batch_size: int, epoch: int, seed: int) -> torch.Tensor:
    """The epoch's shuffled sample order, a function of (seed, epoch) only, so resume replays it exactly."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(n, generator=g)
    usable = (n // batch_size) * batch_size if n >= batch_size else n
    return perm[:usable].view(-1, min(batch_size, n))


def batch_stream(dataset: ChunkDataset, batch_size: int, seed: int,
                 start_step: int) -> Iterator[tuple[int, torch.Tensor]]:
    """(step, sample indices) from ``start_step`` on; the order depends only on (seed, step)."""
    n_batches = len(batch_indices(len(dataset), batch_size, 0, seed))
    step = start_step
    while True:
        epoch, i = divmod(step, n_batches)
        order = batch_indices(len(dataset), batch_size, epoch, seed)
        for j in range(i, n_batches):
            yield step, order[j]
            step += 1


def training_batches(dataset: ChunkDataset, batch_size: int, seed: int, start_step: int, steps: int,
                     share: slice) -> Iterator[tuple[int, torch.Tensor, dict]]:
    """(step, the global batch's indices, this rank's ``share`` of the batch) for steps ``start_step`` to
    ``steps``. A dataset served from host memory gathers the next batch on a background thread while the
    current one trains; the batches are the same either way (they depend only on the indices)."""
    stream = itertools.takewhile(lambda item: item[0] < steps, batch_stream(dataset, batch_size, seed, start_step))
    if not dataset.served:
        for step, idx in stream:
            yield step, idx, dataset.get_batch(idx[share])
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="batches") as pool:
        pending = None  # (step, indices, the batch being gathered) of the step before this one
        for step, idx in stream:
            ahead = (step, idx, pool.submit(dataset.get_batch, idx[share]))
            if pending is not None:
                yield pending[0], pending[1], pending[2].result()
            pending = ahead
        if pending is not None:
            yield pending[0], pending[1], pending[2].result()


# data.on_device=auto keeps the dataset on the GPU when it takes at most this share of the GPU's free memory
GPU_DATA_SHARE = 0.6


def fits_on_device(nbytes: int, free_bytes: int) -> bool:
    return nbytes <= GPU_DATA_SHARE * free_bytes


def load_datasets(spec_kwargs: dict, device: str, on_device: str | bool) -> tuple[ChunkDataset, ChunkDataset | None]:
    """The train and validation splits. On a GPU the whole dataset moves there (``on_device=true``; ``auto``:
    when it fits, see ``fits_on_device``), else it stays in host memory and each batch is copied over."""
    from ript.data.dataset import DatasetSpec, EmptySplitError
    from ript.utils.logging import log

    spec = DatasetSpec(**spec_kwargs)
    train = ChunkDataset(spec, "train")
    try:
        val = ChunkDataset(spec, "val") if spec.val_fraction > 0 else None
    except EmptySplitError:  # too few demos to hold any out; a damaged file still fails
        val = None
    splits = [d for d in (train, val) if d is not None]
    move = bool(on_device) if on_device != "auto" else device.startswith("cuda")
    if move and on_device == "auto":
        nbytes, free = sum(d.nbytes for d in splits), torch.cuda.mem_get_info(torch.device(device))[0]
        move = fits_on_device(nbytes, free)
        if not move:
            log.info("dataset: %.1f GiB does not fit in %.0f%% of the GPU's %.1f GiB free: it stays in host memory "
                     "and batches are copied over", nbytes / 2**30, 100 * GPU_DATA_SHARE, free / 2**30)
    for d in splits:
        if move:
            d.to(device)
        elif device.startswith("cuda"):
            d.serve_to(device)
    return train, val
