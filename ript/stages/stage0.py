"""Stage 0: train the action autoencoder (L1 reconstruction of action chunks through FSQ/VQ tokens)."""

from __future__ import annotations

import time

import torch

from ript.config import data_files, task_names, to_dict
from ript.data.dataset import load_datasets, training_batches
from ript.model_loader import check_and_load
from ript.models.action_autoencoder import ActionAutoencoder
from ript.utils import training
from ript.utils.checkpoint import (checkpoint_config, load_weights, rank_state, restore_training_state,
                                   save_checkpoint, training_state)
from ript.utils.logging import MetricLogger, log, setup_console_logging
from ript.utils import distributed as ddist
from ript.utils.run_dir import prepare_ranked_run_dir, prepare_run_dir
from ript.utils.seeding import seed_everything


def autoencoder_kwargs(cfg) -> dict:
    a = cfg.algo
    return {"action_dim": int(cfg.task.action_dim), "chunk_size": int(a.chunk_size),
            "downsample": int(a.downsample), **{k: (list(v) if k == "fsq_levels" else v)
                                                for k, v in a.autoencoder.items()}}


def codebook_metrics(indices: torch.Tensor, codebook_size: int) -> dict[str, float]:
    return metrics_of_counts(torch.bincount(indices.flatten(), minlength=codebook_size).float())


def metrics_of_counts(counts: torch.Tensor) -> dict[str, float]:
    p = counts / counts.sum()
    entropy = -(p[p > 0] * p[p > 0].log()).sum()
    return {"codebook_usage": float((counts > 0).float().mean()), "perplexity": float(entropy.exp())}


@torch.no_grad()
def validate(model: ActionAutoencoder, dataset, batch_size: int, device: str, amp,
             info: ddist.DistInfo) -> dict[str, float]:
    """Validation L1 and codebook use; under torchrun each rank scores every N-th batch."""
    model.eval()
    l1, n, all_idx = 0.0, 0, []
    for start in range(info.rank * batch_size, len(dataset), batch_size * info.world_size):
        idx = torch.arange(start, min(start + batch_size, len(dataset)))
        batch = dataset.get_batch(idx)
        with training.autocast(device, amp):
            out = model(model.action_normalizer.normalize(batch["actions"].to(device)), batch["action_mask"].to(device))
        l1 += float(out["l1"]) * len(idx)
        n += len(idx)
        all_idx.append(out["indices"].flatten())
    model.train()
    counts = torch.bincount(torch.cat(all_idx), minlength=model.codebook_size).float().cpu()
    l1, n, *counts = ddist.all_sum([l1, float(n), *counts.tolist()], info)
    return {"val/l1": l1 / n, **{f"val/{k}": v for k, v in metrics_of_counts(torch.tensor(counts)).items()}}


def run(cfg) -> str:
    """Stage 0, alone or under torchrun (every rank draws the same global batch and takes its block; gradients
    averaged; rank 0 logs and writes checkpoints)."""
    setup_console_logging()
    device, info = ddist.init_rank(cfg.device)  # first: under torchrun, this rank's GPU
    prepare_run_dir(cfg, create=False)  # fail fast, before loading data
    seed_everything(cfg.seed)
    names = task_names(cfg.task)
    train_set, val_set = load_datasets(
        dict(files=data_files(cfg.task, names), obs_keys={}, chunk_size=int(cfg.algo.chunk_size),
             action_dim=int(cfg.task.action_dim), demos_per_task=cfg.data.demos_per_task,
             val_fraction=float(cfg.data.val_fraction), seed=int(cfg.seed), action_key=str(cfg.data.action_key)),
        device, cfg.data.on_device)
    log.info("stage0: %d tasks, %d train samples, %d demos", len(names), len(train_set), train_set.num_demos)

    kwargs = autoencoder_kwargs(cfg)
    model = ActionAutoencoder(**kwargs)
    model.action_normalizer.fit(train_set.actions)
    model.to(device).train()
    training.fast_math(device, cfg.train)
    forward = training.CompiledLoss(model, cfg.train, device)
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
        log.info("stage0: resumed from %s at step %d", resume_from, start_step)
    logger = MetricLogger(run_dir, to_dict(cfg), run_id, enabled=info.is_main)
    ckpt_config = checkpoint_config("stage0", "action_autoencoder", kwargs, cfg,
                                           train_set.metadata(cfg.task))

    def save(step: int) -> None:
        optimiser_step.check()  # a non-finite step since the last check stops the run before anything is written
        ranks = ddist.gather_objects(rank_state(data_rng=generator.get_state()), info)
        if info.is_main:
            state = training_state(opt, sched, step, logger.run_id, ranks)
            save_checkpoint(run_dir, step, model, ckpt_config, state, keep_last=cfg.train.keep_last)

    from tqdm import tqdm

    bar = tqdm(total=steps, initial=start_step, desc="stage0", unit="step", disable=not (cfg.progress and info.is_main))
    t_start = t_last = time.perf_counter()
    samples = 0
    for step, idx, batch in training_batches(train_set, int(cfg.train.batch_size), int(cfg.seed), start_step, steps,
                                             share):
        with training.autocast(device, cfg.train.amp):
            out = forward(model.action_normalizer.normalize(batch["actions"]), batch["action_mask"])
        # the L1 is a mean over unmasked actions, whose count differs between ranks' blocks
        grad_norm = optimiser_step(out["loss"], step, weight=batch["action_mask"].sum())
        samples += len(idx)
        bar.update(1)
        done = step + 1
        if done % cfg.train.log_every == 0 or done == steps:
            optimiser_step.check()
            dt = time.perf_counter() - t_last
            l1, loss = ddist.all_sum([out["l1"].item(), out["loss"].item()], info)
            metrics = {"train/l1": l1 / info.world_size, "train/loss": loss / info.world_size,
                       "train/grad_norm": float(grad_norm), "train/lr": sched.get_last_lr()[0], "time/samples_per_s": samples / dt,
                       # codebook use of this rank's block of the batch
                       **{f"train/{k}": v for k, v in codebook_metrics(out["indices"], model.codebook_size).items()}}
            logger.log(metrics, done)
            bar.set_postfix(l1=f"{metrics['train/l1']:.4f}", ppl=f"{metrics['train/perplexity']:.0f}")
            t_last, samples = time.perf_counter(), 0
        if val_set is not None and (done % cfg.train.val_every == 0 or done == steps):
            optimiser_step.check()
            metrics = validate(model, val_set, int(cfg.train.batch_size), device, cfg.train.amp, info)
            logger.log(metrics, done)
            log.info("stage0 step %d: val l1 %.4f, codebook usage %.1f%%", done, metrics["val/l1"],
                     100 * metrics["val/codebook_usage"])
        stop = training.out_of_time_everywhere(t_start, cfg.train.stop_after_minutes, info)
        if done % cfg.train.save_every == 0 or done == steps or stop:
            save(done)
        if stop:
            log.info("stage0: stopped after %s min at step %d; continue with resume=true",
                     cfg.train.stop_after_minutes, done)
            break
    bar.close()
    logger.close()
    ddist.barrier(info)  # rank 0's last checkpoint is written before any rank reports the run done
    ddist.shutdown(info)
    log.info("stage0: done; checkpoint %s", run_dir / "checkpoints" / "last")
    return str(run_dir)
