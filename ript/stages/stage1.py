"""Stage 1 (autoregressive prior over skill tokens) and stage 2 (few-shot fine-tuning on new tasks).

Both train a ``SkillPrior`` with teacher-forced cross-entropy; fine-tuning starts from a stage-1
checkpoint, swaps in the new tasks' embeddings, and may also train the decoder with an L1 term.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from ript.config import data_files, task_names, to_dict
from ript.data.dataset import load_datasets, training_batches
from ript.data.language import TASK_ID, embed_instructions
from ript.evaluation.results import evaluation_dir
from ript.evaluation.runner import evaluate_during_training, make_runner
from ript.errors import RiptError
from ript.model_loader import check_and_load, load_model
from ript.models.encoders import random_shift
from ript.models.prior import SkillPrior
from ript.policies.build import sampling_settings, stage1_sampling
from ript.utils import distributed as ddist
from ript.utils import training
from ript.utils.checkpoint import (checkpoint_config, load_weights, mark_best, rank_state, restore_training_state,
                                   save_checkpoint, training_state)
from ript.utils.logging import MetricLogger, log, setup_console_logging
from ript.utils.run_dir import prepare_ranked_run_dir, prepare_run_dir
from ript.utils.seeding import seed_everything


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
    metadata = {**train_set.metadata(cfg.task), "base_checkpoint": base_ckpt["checkpoint_dir"],
                "sampling": stage1_sampling(cfg.algo)}
    return train_prior(cfg, model, kwargs, train_set, val_set, "finetune", metadata, device, info)


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
    ce, acc, n = ddist.all_sum([ce, acc, float(n)], info)
    return {"val/ce": ce / n, "val/token_acc": acc / n}


def best_evaluation(run_dir: Path) -> tuple[float, int] | None:
    """(success rate, step) of the checkpoint ``checkpoints/best`` points to, from its evaluation's results;
    None before the first evaluation."""
    link = run_dir / "checkpoints" / "best"
    if not link.is_symlink():
        return None
    step = int(os.readlink(link))
    results = evaluation_dir(run_dir, step) / "results.json"
    try:
        return float(json.loads(results.read_text())["success_rate"]), step
    except (OSError, ValueError, KeyError) as e:
        raise RiptError(f"{link} points to step {step}, but its evaluation {results} cannot be read ({e}); "
                        f"remove the link to start the comparison afresh") from e


def train_prior(cfg, model: SkillPrior, model_kwargs: dict, train_set, val_set, stage: str, metadata: dict,
                device: str, info: ddist.DistInfo) -> str:
    """The training loop of stage 1 and fine-tuning, alone or under torchrun: every rank draws the same global
    batch and takes its block, gradients are averaged, rank 0 logs, evaluates and writes checkpoints."""
    model.to(device).train()  # the frozen autoencoder stays in eval mode (SkillPrior.train)
    training.fast_math(device, cfg.train)
    training.prepare_model(model, device, cfg.train)
    loss_fn = training.CompiledLoss(model.loss, cfg.train, device)
    share = ddist.batch_share(int(cfg.train.batch_size), info)
    run_dir, resume_from = prepare_ranked_run_dir(cfg, info)  # inputs checked: now the folder may appear
    steps = int(cfg.train.steps)
    opt, sched = training.make_optimizer(model.parameters(), cfg.train, steps, device)
    optimiser_step = training.GuardedStep(model, opt, sched, float(cfg.train.grad_clip), info)
    generator = torch.Generator(device=train_set.device).manual_seed(int(cfg.seed))
    start_step, run_id = 0, None
    if resume_from is not None:
        check_and_load(model, load_weights(resume_from), str(resume_from))
        start_step, run_id, streams = restore_training_state(resume_from, opt, sched, info.rank, info.world_size)
        generator.set_state(streams["data_rng"])  # a CPU ByteTensor, whatever the generator's device
        log.info("%s: resumed from %s at step %d", stage, resume_from, start_step)
    logger = MetricLogger(run_dir, to_dict(cfg), run_id, enabled=info.is_main)
    ckpt_config = checkpoint_config(stage, "skill_prior", model_kwargs, cfg, metadata)
    decoder_l1_weight = float(cfg.get("decoder_l1_weight", 0.0))
    runner = None
    log.info("%s: %d tasks, %d train samples, %d demos, %.1fM trainable params, %d process(es)", stage,
             len(train_set.task_names), len(train_set), train_set.num_demos,
             sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6, info.world_size)

    def evaluate(step: int) -> None:
        nonlocal runner
        if info.is_main:
            if runner is None:
                runner = make_runner(metadata, train_set.task_names, cfg.eval, cfg.workers)
            rate = evaluate_during_training(runner, model, sampling_settings(metadata), device, int(cfg.eval.seed),
                                            evaluation_dir(run_dir, step), logger, step, f"{stage} step {step}",
                                            bool(cfg.cuda_graph))["success_rate"]
            model.train()
            best = best_evaluation(run_dir) if cfg.eval.keep_best else None  # read back: resumed runs too
            if cfg.eval.keep_best and (best is None or rate > best[0]):  # ties: the earlier step stays
                mark_best(run_dir, step)
                log.info("%s: step %d is the best so far (%.1f%%): %s", stage, step, 100 * rate,
                         run_dir / "checkpoints" / "best")
        ddist.barrier(info)

    def save(step: int) -> None:
        optimiser_step.check()  # a non-finite step since the last check stops the run before anything is written
        ranks = ddist.gather_objects(rank_state(data_rng=generator.get_state()), info)
        if info.is_main:
            state = training_state(opt, sched, step, logger.run_id, ranks)
            save_checkpoint(run_dir, step, model, ckpt_config, state, keep_last=cfg.train.keep_last)

    from tqdm import tqdm

    bar = tqdm(total=steps, initial=start_step, desc=stage, unit="step", disable=not (cfg.progress and info.is_main))
    t_start = t_last = time.perf_counter()
    samples = 0
    try:
        for step, idx, batch in training_batches(train_set, int(cfg.train.batch_size), int(cfg.seed), start_step,
                                                 steps, share):
            with training.autocast(device, cfg.train.amp):
                out = prior_loss(model, batch, cfg, generator, decoder_l1_weight, loss_fn, share)
            grad_norm = optimiser_step(out["loss"], step)
            samples += len(idx)
            bar.update(1)
            done = step + 1
            if done % cfg.train.log_every == 0 or done == steps:
                optimiser_step.check()
                dt = time.perf_counter() - t_last
                names = ["ce", "token_acc"] + (["decoder_l1"] if "decoder_l1" in out else [])
                means = ddist.all_sum([out[k].item() for k in names], info)
                metrics = {**{f"train/{k}": v / info.world_size for k, v in zip(names, means)},
                           "train/grad_norm": float(grad_norm), "train/lr": sched.get_last_lr()[0],
                           "time/samples_per_s": samples / dt}
                logger.log(metrics, done)
                bar.set_postfix(ce=f"{metrics['train/ce']:.3f}", acc=f"{metrics['train/token_acc']:.2f}")
                t_last, samples = time.perf_counter(), 0
            if val_set is not None and (done % cfg.train.val_every == 0 or done == steps):
                optimiser_step.check()
                metrics = validate(model, val_set, cfg, device, info)
                logger.log(metrics, done)
                log.info("%s step %d: val ce %.3f, token acc %.3f", stage, done, metrics["val/ce"],
                         metrics["val/token_acc"])
            stop = training.out_of_time_everywhere(t_start, cfg.train.stop_after_minutes, info)
            evaluating = bool(cfg.eval.every) and (done % cfg.eval.every == 0 or done == steps)
            if done % cfg.train.save_every == 0 or done == steps or stop or evaluating:
                save(done)  # an evaluated step is saved: it may become checkpoints/best
            if evaluating:
                evaluate(done)
            if stop:
                log.info("%s: stopped after %s min at step %d; continue with resume=true", stage,
                         cfg.train.stop_after_minutes, done)
                break
    finally:
        bar.close()
        if runner is not None:
            runner.close()
        logger.close()
    ddist.barrier(info)  # rank 0's last checkpoint is written before any rank reports the run done
    ddist.shutdown(info)
    log.info("%s: done; checkpoint %s", stage, run_dir / "checkpoints" / "last")
    return str(run_dir)
