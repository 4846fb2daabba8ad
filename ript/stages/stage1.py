"""Stage 1 (autoregressive prior over skill tokens) and stage 2 (few-shot fine-tuning on new tasks).

Both train a ``SkillPrior`` with teacher-forced cross-entropy; fine-tuning starts from a stage-1
checkpoint, swaps in the new tasks' embeddings, and may also train the decoder with an L1 term.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ript.config import data_files, task_names, to_dict
from ript.data.dataset import check_resume_data, load_datasets, training_batches
from ript.data.language import TASK_ID, embed_instructions
from ript.errors import RiptError
from ript.evaluation.results import evaluation_dir
from ript.evaluation.runner import evaluate_during_training, make_runner
from ript.model_loader import check_and_load, load_model
from ript.models.encoders import random_shift
from ript.models.prior import SkillPrior
from ript.policies.build import sampling_settings, stage1_sampling
from ript.utils import distributed as ddist
from ript.utils import training
from ript.utils.checkpoint import checkpoint_config, load_weights
from ript.utils.logging import log, setup_console_logging
from ript.utils.run_dir import covered, flatten, prepare_ranked_run_dir, prepare_run_dir
from ript.utils.seeding import seed_everything
from ript.utils.trainer import RunSettings, Throughput, TrainingRun, due, sum_by_name


def _datasets(cfg, chunk_size: int, device: str):
    names = task_names(cfg.task)
    return load_datasets(
        dict(files=data_files(cfg.task, names), obs_keys=dict(cfg.task.obs_keys), chunk_size=chunk_size,
             frame_stack=int(cfg.algo.frame_stack), action_dim=int(cfg.task.action_dim),
             demos_per_task=cfg.data.demos_per_task, val_fraction=float(cfg.data.val_fraction),
             seed=int(cfg.seed), flip_keys=tuple(cfg.task.flip_obs_keys), action_key=str(cfg.data.action_key)),
        device, cfg.data.on_device)


def _language(cfg, instructions: list[str]) -> torch.Tensor | None:
    if cfg.lang.encoder == TASK_ID:
        return None
    cache = Path(cfg.lang.cache_file) if cfg.lang.cache_file else None
    return embed_instructions(instructions, str(cfg.lang.encoder), cache)


def _set_task_conditioning(model: SkillPrior, embeddings: torch.Tensor | None) -> None:
    if embeddings is not None:
        model.task_embeddings.copy_(embeddings)


def run(cfg) -> str:
    """Stage 1: train the prior on top of an explicit stage-0 checkpoint."""
    setup_console_logging()
    if not cfg.stage0_checkpoint:
        raise RiptError("stage1 needs stage0_checkpoint=<stage-0 run dir or checkpoint>")
    device, info = ddist.init_rank(cfg.device)  # first: under torchrun, this rank's GPU
    autoencoder, ae_ckpt = load_model(cfg.stage0_checkpoint, expect_stage="stage0")
    if autoencoder.action_dim != int(cfg.task.action_dim):
        raise RiptError(f"{ae_ckpt['checkpoint_dir']}: autoencoder action_dim {autoencoder.action_dim} != "
                        f"task.action_dim {cfg.task.action_dim}")
    prepare_run_dir(cfg, create=False)  # fail fast, before loading data
    seed_everything(cfg.seed)
    train_set, val_set = _datasets(cfg, autoencoder.chunk_size, device)
    embeddings = _language(cfg, train_set.instructions)
    shapes = train_set.obs_shapes()
    kwargs = {
        "autoencoder": ae_ckpt["model_kwargs"],
        "task_names": train_set.task_names,
        "image_keys": [k for k, s in shapes.items() if len(s) == 3],
        "lowdim_dims": {k: s[0] for k, s in shapes.items() if len(s) == 1},
        "lang_dim": None if embeddings is None else int(embeddings.shape[1]),
        "frame_stack": int(cfg.algo.frame_stack),
        **dict(cfg.algo.prior),
    }
    model = SkillPrior(**kwargs)
    model.autoencoder.load_state_dict(autoencoder.state_dict())
    _set_task_conditioning(model, embeddings)
    for k in model.lowdim_keys:
        model.lowdim_normalizers[k].fit(train_set.obs[k])
    metadata = {**train_set.metadata(cfg.task), "stage0_checkpoint": ae_ckpt["checkpoint_dir"],
                "sampling": stage1_sampling(cfg.algo)}
    return train_prior(cfg, model, kwargs, train_set, val_set, "stage1", metadata, device, info)


def run_finetune(cfg) -> str:
    """Stage 2: few-shot fine-tuning of a stage-1 checkpoint on new tasks."""
    setup_console_logging()
    if not cfg.checkpoint:
        raise RiptError("finetune needs checkpoint=<stage-1 run dir or checkpoint>")
    device, info = ddist.init_rank(cfg.device)  # first: under torchrun, this rank's GPU
    base, base_ckpt = load_model(cfg.checkpoint, expect_stage=("stage1", "finetune"))
    _check_base_algo(cfg, base_ckpt)
    prepare_run_dir(cfg, create=False)  # fail fast, before loading data
    seed_everything(cfg.seed)
    train_set, val_set = _datasets(cfg, base.autoencoder.chunk_size, device)
    embeddings = _language(cfg, train_set.instructions)
    kwargs = {**base_ckpt["model_kwargs"], "task_names": train_set.task_names}
    if (embeddings is None) != (kwargs["lang_dim"] is None):
        raise RiptError(f"lang.encoder={cfg.lang.encoder!r} does not match the checkpoint's task conditioning")
    model = SkillPrior(**kwargs)
    # everything but the per-task conditioning carries over from the base model
    state = {k: v for k, v in base.state_dict().items() if not k.startswith(("task_embeddings", "task_table"))}
    model.load_state_dict(state, strict=False)
    _set_task_conditioning(model, embeddings)
    if float(cfg.decoder_l1_weight) > 0:
        for part in (model.autoencoder.from_code, model.autoencoder.decoder, model.autoencoder.out,
                     model.autoencoder.dec_queries, model.autoencoder.dec_mem_pos):
            part.requires_grad_(True)
    # the replanning and sampling the base was trained for (equal to cfg.algo's, _check_base_algo saw to it)
    sampling = base_ckpt.get("metadata", {}).get("sampling") or stage1_sampling(cfg.algo)
    metadata = {**train_set.metadata(cfg.task), "base_checkpoint": base_ckpt["checkpoint_dir"], "sampling": sampling}
    return train_prior(cfg, model, kwargs, train_set, val_set, "finetune", metadata, device, info)


# algo keys fine-tuning applies itself; every other one is the base checkpoint's (architecture, replanning)
FINETUNE_OWN_ALGO_KEYS = ("image_aug_pad",)


def _check_base_algo(cfg, base_ckpt: dict) -> None:
    """Fine-tuning keeps the base model and its replanning: an ``algo`` setting that differs from the base's
    would be recorded without being applied, so it is refused."""
    base_algo = (base_ckpt.get("cfg") or {}).get("algo")
    if not isinstance(base_algo, dict):
        return  # a checkpoint that records no config: its model_kwargs alone define the model
    old, new = flatten(base_algo, "algo"), flatten(to_dict(cfg.algo), "algo")
    diffs = [k for k in sorted(set(old) | set(new), key=lambda k: (k != "algo.name", k))
             if old.get(k) != new.get(k) and not covered(k, tuple(f"algo.{k}" for k in FINETUNE_OWN_ALGO_KEYS))]
    if diffs:
        key = diffs[0]
        raise RiptError(f"finetune: {key}={new.get(key)!r} differs from the base checkpoint's {old.get(key)!r} "
                        f"({base_ckpt['checkpoint_dir']}); fine-tuning keeps the base's architecture and replanning: "
                        f"pass algo={base_algo.get('name')} without algo overrides (eval takes "
                        f"sampling.action_horizon=... to replan otherwise)")


def prior_loss(model: SkillPrior, batch: dict, cfg, generator: torch.Generator, decoder_l1_weight: float,
               loss_fn=None, share: slice | None = None) -> dict:
    """The training loss of a batch: augmented images, token cross-entropy (``loss_fn``: ``model.loss`` or
    its compiled form), and the decoder's L1 term when fine-tuning trains the decoder. ``share``: the batch is
    this rank's block of the global batch of ``train.batch_size`` samples."""
    def augment(v: torch.Tensor) -> torch.Tensor:
        frames = v.shape[1]  # images (B, frame_stack, H, W, C): one shift per frame
        rows = slice(share.start * frames, share.stop * frames) if share is not None else None
        return random_shift(v.flatten(0, 1), int(cfg.algo.image_aug_pad), generator, rows,
                            int(cfg.train.batch_size) * frames).view_as(v)

    obs = {k: augment(v) if k in model.image_keys else v for k, v in batch["obs"].items()}
    out = (loss_fn or model.loss)(obs, batch["task_ids"], batch["actions"])
    if decoder_l1_weight > 0:
        ae = model.autoencoder
        target = ae.action_normalizer.normalize(batch["actions"])
        recon = ae.decode_indices(out["targets"])
        m = batch["action_mask"].unsqueeze(-1).to(recon.dtype)
        l1 = ((recon - target).abs() * m).sum() / (m.sum() * recon.shape[-1]).clamp(min=1)
        out["decoder_l1"] = l1
        out["loss"] = out["loss"] + decoder_l1_weight * l1
    return out


@torch.no_grad()
def validate(model: SkillPrior, dataset, cfg, device: str, info: ddist.DistInfo) -> dict[str, float]:
    """Validation cross-entropy and token accuracy; under torchrun each rank scores every N-th batch."""
    model.eval()
    ce, acc, n = 0.0, 0.0, 0
    bs = int(cfg.train.batch_size)
    for start in range(info.rank * bs, len(dataset), bs * info.world_size):
        idx = torch.arange(start, min(start + bs, len(dataset)))
        batch = dataset.get_batch(idx)
        batch = {**batch, "obs": {k: v.to(device) for k, v in batch["obs"].items()},
                 "actions": batch["actions"].to(device), "task_ids": batch["task_ids"].to(device)}
        with training.autocast(device, cfg.train.amp):
            out = model.loss(batch["obs"], batch["task_ids"], batch["actions"])
        ce += float(out["ce"]) * len(idx)
        acc += float(out["token_acc"]) * len(idx)
        n += len(idx)
    model.train()
    sums = sum_by_name({"ce": ce, "token_acc": acc, "n": float(n)}, info)
    return {"val/ce": sums["ce"] / sums["n"], "val/token_acc": sums["token_acc"] / sums["n"]}


def train_prior(cfg, model: SkillPrior, model_kwargs: dict, train_set, val_set, stage: str, metadata: dict,
                device: str, info: ddist.DistInfo) -> str:
    """The training loop of stage 1 and fine-tuning, alone or under torchrun: every rank draws the same global
    batch and takes its block, gradients are averaged, rank 0 logs, evaluates and writes checkpoints."""
    model.to(device).train()  # the frozen autoencoder stays in eval mode (SkillPrior.train)
    training.fast_math(device, cfg.train)
    training.prepare_model(model, device, cfg.train)
    ddist.batch_share(int(cfg.train.batch_size), info)  # a batch the ranks cannot split is refused here
    _check_batch_fits(int(cfg.train.batch_size), train_set)
    run_dir, resume_from = prepare_ranked_run_dir(cfg, info)  # inputs checked: now the folder may appear
    check_resume_data(resume_from, train_set, cfg.resume_allow_changes)
    log.info("%s: %d tasks, %d train samples, %d demos, %.1fM trainable params, %d process(es)", stage,
             len(train_set.task_names), len(train_set), train_set.num_demos,
             sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6, info.world_size)
    evaluation = Evaluation(metadata, train_set.task_names, cfg, run_dir, stage, device) if info.is_main else None
    try:
        PriorTraining(cfg, model, train_set, val_set, stage, device, info).run(
            RunSettings(stage, run_dir, resume_from, cfg.train.keep_last, cfg.train.stop_after_minutes),
            checkpoint_config(stage, "skill_prior", model_kwargs, cfg, metadata), evaluation)
    finally:
        if evaluation is not None:
            evaluation.close()
    log.info("%s: done; checkpoint %s", stage, run_dir / "checkpoints" / "last")
    return str(run_dir)


def _check_batch_fits(batch_size: int, train_set) -> None:
    """A step draws ``train.batch_size`` samples (and the image augmentation's offsets for that many): a smaller
    training split cannot make one batch."""
    if batch_size <= len(train_set):
        return
    lengths = (train_set.episode_end - train_set.episode_start).unique()
    short = " (every demo is shorter than two steps)" if int(lengths.max()) < 2 else ""
    raise RiptError(f"train.batch_size={batch_size} is larger than the training split: {len(train_set)} samples "
                    f"from {train_set.num_demos} demos{short}; lower train.batch_size to at most {len(train_set)} "
                    f"or train on more (or longer) demos")


class Evaluation:
    """In-training evaluation in the simulator (rank 0): the runner, built at the first evaluation, and the
    best checkpoint by success rate (``eval.keep_best``)."""

    def __init__(self, metadata: dict, task_names: list[str], cfg, run_dir: Path, stage: str, device: str):
        self.metadata, self.task_names, self.run_dir, self.stage, self.device = (metadata, task_names, run_dir,
                                                                                 stage, device)
        self.eval_cfg, self.workers_cfg, self.cuda_graph = cfg.eval, cfg.workers, bool(cfg.cuda_graph)
        self.runner = None

    def __call__(self, model: SkillPrior, step: int, run: TrainingRun) -> None:
        if self.runner is None:
            self.runner = make_runner(self.metadata, self.task_names, self.eval_cfg, self.workers_cfg)
        rate = evaluate_during_training(self.runner, model, sampling_settings(self.metadata), self.device,
                                        int(self.eval_cfg.seed), evaluation_dir(self.run_dir, step), run.logger, step,
                                        f"{self.stage} step {step}", self.cuda_graph)["success_rate"]
        model.train()
        if self.eval_cfg.keep_best:
            run.keep_best(step, rate, lambda best: evaluation_dir(self.run_dir, best) / "results.json")

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()


class PriorTraining:
    """The steps of stage 1 and fine-tuning: the loss, its metrics, validation."""

    def __init__(self, cfg, model: SkillPrior, train_set, val_set, stage: str, device: str, info: ddist.DistInfo):
        self.cfg, self.model, self.train_set, self.val_set, self.stage = cfg, model, train_set, val_set, stage
        self.device, self.info, self.train_cfg = device, info, cfg.train
        self.share = ddist.batch_share(int(cfg.train.batch_size), info)
        self.loss_fn = training.CompiledLoss(model.loss, cfg.train, device)
        self.decoder_l1_weight = float(cfg.get("decoder_l1_weight", 0.0))

    def run(self, settings: RunSettings, ckpt_config: dict, evaluate: Evaluation | None) -> None:
        cfg, t, model, info = self.cfg, self.train_cfg, self.model, self.info
        steps = int(t.steps)
        opt, sched = training.make_optimizer(model.parameters(), t, steps, self.device)
        optimiser_step = training.GuardedStep(model, opt, sched, float(t.grad_clip), info)
        generator = torch.Generator(device=self.train_set.device).manual_seed(int(cfg.seed))
        run = TrainingRun(settings, info, opt, sched)
        streams = run.resume(lambda ckpt: check_and_load(model, load_weights(ckpt), str(ckpt)))
        if streams is not None:
            generator.set_state(streams["data_rng"])  # a CPU ByteTensor, whatever the generator's device
        run.open_logger(to_dict(cfg))
        bar, speed = run.progress(steps, bool(cfg.progress)), Throughput()
        try:
            for step, idx, batch in training_batches(self.train_set, int(t.batch_size), int(cfg.seed), run.start,
                                                     steps, self.share):
                with training.autocast(self.device, t.amp):
                    out = prior_loss(model, batch, cfg, generator, self.decoder_l1_weight, self.loss_fn, self.share)
                grad_norm = optimiser_step(out["loss"], step)
                speed.add(len(idx))
                bar.update(1)
                done = step + 1
                if due(t.log_every, done, steps):
                    optimiser_step.check()
                    self.log_training(out, grad_norm, sched.get_last_lr()[0], speed.read(), done, run, bar)
                if self.val_set is not None and due(t.val_every, done, steps):
                    optimiser_step.check()
                    self.log_validation(done, run)
                stop = run.out_of_time()
                evaluating = due(cfg.eval.every, done, steps)
                if due(t.save_every, done, steps) or stop or evaluating:  # an evaluated step may become the best
                    optimiser_step.check()  # a non-finite step since the last check: stop before anything is written
                    run.save(done, model, ckpt_config, {"data_rng": generator.get_state()})
                if evaluating:
                    if evaluate is not None:
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
        names = ["ce", "token_acc"] + (["decoder_l1"] if "decoder_l1" in out else [])
        sums = sum_by_name({k: out[k].item() for k in names}, self.info)
        metrics = {**{f"train/{k}": v / self.info.world_size for k, v in sums.items()},
                   "train/grad_norm": float(grad_norm), "train/lr": lr, "time/samples_per_s": samples_per_s}
        run.logger.log(metrics, done)
        bar.set_postfix(ce=f"{metrics['train/ce']:.3f}", acc=f"{metrics['train/token_acc']:.2f}")

    def log_validation(self, done: int, run: TrainingRun) -> None:
        metrics = validate(self.model, self.val_set, self.cfg, self.device, self.info)
        run.logger.log(metrics, done)
        log.info("%s step %d: val ce %.3f, token acc %.3f", self.stage, done, metrics["val/ce"],
                 metrics["val/token_acc"])
