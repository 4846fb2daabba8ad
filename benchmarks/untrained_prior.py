"""The model the speed benchmarks time: an untrained skill prior of the configured size (its cost does not depend
on its weights) on a few scripted demos of the configured suite, collected as ``ript collect`` would."""

from __future__ import annotations

from pathlib import Path

from ript.config import to_dict
from ript.data.dataset import ChunkDataset, DatasetSpec
from ript.envs.suites import task_horizon
from ript.models.prior import SkillPrior
from ript.stages.stage0 import autoencoder_kwargs

TASKS = ["button-press-v3", "drawer-close-v3"]


def ensure_data(cfg, data_dir: Path, demos: int, names: list[str] = TASKS) -> list[Path]:
    """Scripted demos of ``names`` of the configured suite, collected as ``ript collect`` would (if missing)."""
    from ript.experts.collect import collect_demos, require_complete

    pattern = str(cfg.task.get("file_pattern") or "{name}.hdf5")
    stats = collect_demos(str(cfg.task.suite), names, data_dir, demos, to_dict(cfg.task.render),
                          task_horizon(cfg.task), noise=float(cfg.task.expert_noise), file_pattern=pattern,
                          episodes_per_job=max(1, demos // 2))
    require_complete(stats, demos, data_dir)
    return [data_dir / pattern.format(name=n) for n in names]


def demo_dataset(cfg, data_dir: Path, demos: int, names: list[str] = TASKS) -> ChunkDataset:
    """Scripted demos of the benchmark tasks (collected if missing) as one training dataset."""
    files = ensure_data(cfg, data_dir, demos, names)
    return ChunkDataset(DatasetSpec(files, dict(cfg.task.obs_keys), int(cfg.algo.chunk_size), int(cfg.algo.frame_stack),
                                    val_fraction=0.0, flip_keys=tuple(cfg.task.get("flip_obs_keys") or ())), "all")


def prior_sampling(cfg) -> dict:
    """The chunk policy's sampling settings as the config's algo gives them (its action horizon, temperature, top-k)."""
    return {"action_horizon": int(cfg.algo.action_horizon), **to_dict(cfg.algo.sampling)}


def make_prior(cfg, ds: ChunkDataset) -> SkillPrior:
    shapes = ds.obs_shapes()
    return SkillPrior(autoencoder=autoencoder_kwargs(cfg), task_names=ds.task_names,
                      image_keys=[k for k, s in shapes.items() if len(s) == 3],
                      lowdim_dims={k: s[0] for k, s in shapes.items() if len(s) == 1}, lang_dim=384,
                      frame_stack=int(cfg.algo.frame_stack), **dict(cfg.algo.prior))
