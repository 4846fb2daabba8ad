"""What the imitation stages share (stage 1, few-shot fine-tuning, the flow policy): the datasets and instruction
embeddings, and one training loop, alone or under torchrun, over an ``Objective`` — the stage's loss, its
metrics, its validation and the policy its evaluations run."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch

from ript.config import data_files, task_names, to_dict
from ript.data.dataset import check_resume_data, load_datasets, training_batches
from ript.data.language import TASK_ID, embed_instructions
from ript.errors import RiptError
from ript.evaluation.results import evaluation_dir
from ript.evaluation.runner import evaluate_policy, make_runner
from ript.model_loader import check_and_load
from ript.models.encoders import color_jitter, random_shift
from ript.policies.base import ChunkingPolicy
from ript.utils import distributed as ddist
from ript.utils import training
from ript.utils.checkpoint import checkpoint_config, load_weights
from ript.utils.logging import log
from ript.utils.run_dir import prepare_ranked_run_dir
from ript.utils.seeding import restore_generator
from ript.utils.trainer import RunSettings, Throughput, TrainingRun, due, sum_by_name


class Objective(Protocol):
    model_name: str              # the registered model the checkpoints record
    metrics: tuple[str, ...]     # what a training step logs as train/<name> (the first two in the progress bar)

    def loss(self, batch: dict, generator: torch.Generator, share: slice | None) -> dict: ...  # "loss" + metrics

    def validation(self, batch: dict) -> dict[str, torch.Tensor]: ...  # a validation batch's mean of each metric

    def policy(self, metadata: dict, device: str, seed: int, cuda_graph: bool) -> ChunkingPolicy: ...  # evaluation


def datasets(cfg, chunk_size: int, device: str, extra_files: list[Path] = (), **spec):
    """The train and validation splits of the task's demos (and of ``extra_files``: more episodes of its tasks);
    ``spec``: further ``DatasetSpec`` fields."""
    names = task_names(cfg.task)
    return load_datasets(
        dict(files=[*data_files(cfg.task, names), *extra_files], obs_keys=dict(cfg.task.obs_keys),
             chunk_size=chunk_size,
             frame_stack=int(cfg.algo.frame_stack), action_dim=int(cfg.task.action_dim),
             demos_per_task=cfg.data.demos_per_task, val_fraction=float(cfg.data.val_fraction),
             seed=int(cfg.seed), flip_keys=tuple(cfg.task.flip_obs_keys), action_key=str(cfg.data.action_key),
             **spec),
        device, cfg.data.on_device)


def language(cfg, instructions: list[str]) -> torch.Tensor | None:
    if cfg.lang.encoder == TASK_ID:
        return None
    cache = Path(cfg.lang.cache_file) if cfg.lang.cache_file else None
    return embed_instructions(instructions, str(cfg.lang.encoder), cache)


def observation_kwargs(train_set, embeddings: torch.Tensor | None, frame_stack: int) -> dict:
    """The conditioning a model built on this training split reads: its tasks, cameras, low-dim keys, language."""
    shapes = train_set.obs_shapes()
    return {"task_names": train_set.task_names, "image_keys": [k for k, s in shapes.items() if len(s) == 3],
            "lowdim_dims": {k: s[0] for k, s in shapes.items() if len(s) == 1},
            "lang_dim": None if embeddings is None else int(embeddings.shape[1]), "frame_stack": frame_stack}


def augment_images(obs: dict[str, torch.Tensor], image_keys: list[str], cfg, generator: torch.Generator,
                   share: slice | None) -> dict[str, torch.Tensor]:
    """A batch's observations with each image frame randomly shifted by up to ``algo.image_aug_pad`` pixels, then
    its colours jittered at ``algo.image_aug_color`` (0: not); ``share``: the batch is this rank's block of the
    global batch of ``train.batch_size`` samples."""
    strength = float(cfg.algo.get("image_aug_color") or 0.0)

    def augment(v: torch.Tensor) -> torch.Tensor:
        frames = v.shape[1]  # images (B, frame_stack, H, W, C): one shift per frame
        rows = slice(share.start * frames, share.stop * frames) if share is not None else None
        total = int(cfg.train.batch_size) * frames
        out = random_shift(v.flatten(0, 1), int(cfg.algo.image_aug_pad), generator, rows, total)
        return color_jitter(out, strength, generator, rows, total).view_as(v)

    return {k: augment(v) if k in image_keys else v for k, v in obs.items()}


def train_imitation(cfg, objective: Objective, model, model_kwargs: dict, train_set, val_set, stage: str,
                    metadata: dict, device: str, info: ddist.DistInfo) -> str:
    """An imitation stage's training, alone or under torchrun: every rank draws the same global batch and takes
    its block, gradients are averaged, rank 0 logs, evaluates and writes checkpoints."""
    model.to(device).train()
    training.fast_math(device, cfg.train)
    training.prepare_model(model, device, cfg.train)
    ddist.batch_share(int(cfg.train.batch_size), info)  # a batch the ranks cannot split is refused here
    check_batch_fits(int(cfg.train.batch_size), train_set)
    run_dir, resume_from = prepare_ranked_run_dir(cfg, info)  # inputs checked: now the folder may appear
    check_resume_data(resume_from, train_set, cfg.resume_allow_changes)
    log.info("%s: %d tasks, %d train samples, %d demos, %.1fM trainable params, %d process(es)", stage,
             len(train_set.task_names), len(train_set), train_set.num_demos,
             sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6, info.world_size)
    evaluation = Evaluation(objective, metadata, train_set.task_names, cfg, run_dir, stage, device) \
        if info.is_main and int(cfg.eval.every) else None
    try:
        ImitationTraining(cfg, objective, model, train_set, val_set, stage, device, info).run(
            RunSettings(stage, run_dir, resume_from, cfg.train.keep_last, cfg.train.stop_after_minutes,
                        compile_cache=cfg.get("compile_cache"), fewer_ranks=bool(cfg.get("resume_fewer_ranks"))),
            checkpoint_config(stage, objective.model_name, model_kwargs, cfg, metadata), evaluation)
    finally:
        if evaluation is not None:
            evaluation.close()
    log.info("%s: done; checkpoint %s", stage, run_dir / "checkpoints" / "last")
    return str(run_dir)


def check_batch_fits(batch_size: int, train_set) -> None:
    """A step draws ``train.batch_size`` samples (and the image augmentation's offsets for that many): a smaller
    training split cannot make one batch."""
    if batch_size <= len(train_set):
        return
    lengths = (train_set.episode_end - train_set.episode_start).unique()
    short = " (every demo is shorter than two steps)" if int(lengths.max()) < 2 else ""
    raise RiptError(f"train.batch_size={batch_size} is larger than the training split: {len(train_set)} samples "
                    f"from {train_set.num_demos} demos{short}; lower train.batch_size to at most {len(train_set)} "
                    f"or train on more (or longer) demos")


@torch.no_grad()
def validate(model, objective: Objective, dataset, cfg, device: str, info: ddist.DistInfo) -> dict[str, float]:
    """The objective's validation metrics over the split; under torchrun each rank scores every N-th batch."""
    model.eval()
    sums: dict[str, float] = {}
    n = 0
    bs = int(cfg.train.batch_size)
    for start in range(info.rank * bs, len(dataset), bs * info.world_size):
        idx = torch.arange(start, min(start + bs, len(dataset)))
        batch = {k: {n: t.to(device) for n, t in v.items()} if isinstance(v, dict) else v.to(device)
                 for k, v in dataset.get_batch(idx).items()}
        with training.autocast(device, cfg.train.amp):
            out = objective.validation(batch)
        for k, v in out.items():
            sums[k] = sums.get(k, 0.0) + float(v) * len(idx)
        n += len(idx)
    model.train()
    # every rank's sums, whole: a split smaller than the ranks' batches leaves some ranks none, hence no names,
    # and a reduction over name lists that differ would pair the ranks' collectives wrongly
    ranks = ddist.gather_objects((sums, n), info)
    total = sum(count for _, count in ranks)
    names = list(dict.fromkeys(k for rank_sums, _ in ranks for k in rank_sums))
    return {f"val/{k}": sum(rank_sums.get(k, 0.0) for rank_sums, _ in ranks) / total for k in names}


class Evaluation:
    """In-training evaluation in the simulator (rank 0): the runner, built at the first evaluation, and the
    best checkpoint by success rate (``eval.keep_best``)."""

    def __init__(self, objective: Objective, metadata: dict, task_names: list[str], cfg, run_dir: Path, stage: str,
                 device: str):
        self.objective, self.metadata, self.task_names = objective, metadata, task_names
        self.run_dir, self.stage, self.device = run_dir, stage, device
        self.eval_cfg, self.workers_cfg, self.cuda_graph = cfg.eval, cfg.workers, bool(cfg.cuda_graph)
        self.runner = None

    def __call__(self, model, step: int, run: TrainingRun) -> None:
        if self.runner is None:
            self.runner = make_runner(self.metadata, self.task_names, self.eval_cfg, self.workers_cfg)
        seed = int(self.eval_cfg.seed)
        rate = evaluate_policy(self.runner, lambda: self.objective.policy(self.metadata, self.device, seed,
                                                                          self.cuda_graph),
                               self.device, evaluation_dir(self.run_dir, step), run.logger, step,
                               f"{self.stage} step {step}", {"sampling": self.metadata["sampling"]})["success_rate"]
        model.train()
        if self.eval_cfg.keep_best:
            run.keep_best(step, rate, lambda best: evaluation_dir(self.run_dir, best) / "results.json")

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()


class ImitationTraining:
    """The steps: the objective's loss, its metrics, validation, checkpoints, evaluations."""

    def __init__(self, cfg, objective: Objective, model, train_set, val_set, stage: str, device: str,
                 info: ddist.DistInfo):
        self.cfg, self.objective, self.model, self.train_set, self.val_set = cfg, objective, model, train_set, val_set
        self.stage, self.device, self.info, self.train_cfg = stage, device, info, cfg.train
        self.share = ddist.batch_share(int(cfg.train.batch_size), info)

    def run(self, settings: RunSettings, ckpt_config: dict, evaluate: Evaluation | None) -> None:
        cfg, t, model, info = self.cfg, self.train_cfg, self.model, self.info
        steps = int(t.steps)
        opt, sched = training.make_optimizer(model.parameters(), t, steps, self.device)
        average = training.WeightAverage.from_config(model, t)  # what checkpoints hold and evaluations run
        optimiser_step = training.GuardedStep(model, opt, sched, float(t.grad_clip), info, average)
        generator = torch.Generator(device=self.train_set.device).manual_seed(int(cfg.seed))
        run = TrainingRun(settings, info, opt, sched, average=average)
        streams = run.resume(lambda ckpt: check_and_load(model, load_weights(ckpt), str(ckpt)))
        if streams is not None:
            restore_generator(generator, streams["data_rng"], settings.resume_from, "data_rng")
        run.open_logger(to_dict(cfg))
        bar, speed = run.progress(steps, bool(cfg.progress)), Throughput()
        try:
            for step, idx, batch in training_batches(self.train_set, int(t.batch_size), int(cfg.seed), run.start,
                                                     steps, self.share):
                with training.autocast(self.device, t.amp):
                    out = self.objective.loss(batch, generator, self.share)
                grad_norm = optimiser_step(out["loss"], step)
                speed.add(len(idx))
                bar.update(1)
                done = step + 1
                if due(t.log_every, done, steps):
                    optimiser_step.check()
                    self.log_training(out, grad_norm, sched.get_last_lr()[0], speed.read(), done, run, bar)
                if self.val_set is not None and due(t.val_every, done, steps):
                    optimiser_step.check()
                    with training.averaged(average):
                        self.log_validation(done, run)
                stop = run.out_of_time()
                evaluating = due(cfg.eval.every, done, steps)
                if due(t.save_every, done, steps) or stop or evaluating:  # an evaluated step may become the best
                    optimiser_step.check()  # a non-finite step since the last check: stop before anything is written
                    run.save(done, model, ckpt_config, {"data_rng": generator.get_state()})
                if evaluating:
                    if evaluate is not None:
                        with training.averaged(average):
                            evaluate(model, done, run)
                    ddist.barrier(info)
                if stop:
                    run.stopped(done)
                    break
            run.finish()
        finally:
            bar.close()
            run.close()

    def log_training(self, out: dict, grad_norm, lr: float, samples_per_s: float, done: int, run: TrainingRun,
                     bar) -> None:
        names = [k for k in self.objective.metrics if k in out]
        sums = sum_by_name({k: out[k].item() for k in names}, self.info)
        metrics = {**{f"train/{k}": v / self.info.world_size for k, v in sums.items()},
                   "train/grad_norm": float(grad_norm), "train/lr": lr, "time/samples_per_s": samples_per_s}
        run.logger.log(metrics, done)
        bar.set_postfix({k: f"{metrics[f'train/{k}']:.3f}" for k in names[:2]})

    def log_validation(self, done: int, run: TrainingRun) -> None:
        metrics = validate(self.model, self.objective, self.val_set, self.cfg, self.device, self.info)
        run.logger.log(metrics, done)
        log.info("%s step %d: %s", self.stage, done, ", ".join(f"{k[4:]} {v:.3f}" for k, v in metrics.items()))
