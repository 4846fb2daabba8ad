"""Stage 0: train the action autoencoder (L1 reconstruction of action chunks through FSQ/VQ tokens)."""

from __future__ import annotations

import torch

from ript.config import data_files, task_names, to_dict
from ript.data.dataset import check_resume_data, load_datasets, training_batches
from ript.model_loader import check_and_load
from ript.models.action_autoencoder import ActionAutoencoder
from ript.utils import distributed as ddist
from ript.utils import training
from ript.utils.checkpoint import checkpoint_config, load_weights
from ript.utils.logging import log, setup_console_logging
from ript.utils.run_dir import prepare_ranked_run_dir, prepare_run_dir
from ript.utils.seeding import restore_generator, seed_everything
from ript.utils.trainer import RunSettings, Throughput, TrainingRun, due, sum_by_name


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
    # a split smaller than the ranks' batches leaves some ranks none: they add no codes
    counts = torch.bincount(torch.cat(all_idx), minlength=model.codebook_size).float().cpu() if all_idx \
        else torch.zeros(model.codebook_size)
    sums = sum_by_name({"l1": l1, "n": float(n), **{f"count/{i}": c for i, c in enumerate(counts.tolist())}}, info)
    counts = torch.tensor([sums[f"count/{i}"] for i in range(model.codebook_size)])
    return {"val/l1": sums["l1"] / sums["n"], **{f"val/{k}": v for k, v in metrics_of_counts(counts).items()}}


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
    ddist.batch_share(int(cfg.train.batch_size), info)  # a batch the ranks cannot split is refused here
    run_dir, resume_from = prepare_ranked_run_dir(cfg, info)  # inputs checked: now the folder may appear
    check_resume_data(resume_from, train_set, cfg.resume_allow_changes)
    ckpt_config = checkpoint_config("stage0", "action_autoencoder", kwargs, cfg, train_set.metadata(cfg.task))
    settings = RunSettings("stage0", run_dir, resume_from, cfg.train.keep_last, cfg.train.stop_after_minutes,
                           compile_cache=cfg.get("compile_cache"), fewer_ranks=bool(cfg.get("resume_fewer_ranks")))
    train(model, train_set, val_set, cfg.train, settings,
          ckpt_config, to_dict(cfg), int(cfg.seed), bool(cfg.progress), device, info)
    log.info("stage0: done; checkpoint %s", run_dir / "checkpoints" / "last")
    return str(run_dir)


def train(model: ActionAutoencoder, train_set, val_set, train_cfg, settings: RunSettings, ckpt_config: dict,
          logged_config: dict, seed: int, progress: bool, device: str, info: ddist.DistInfo) -> None:
    """The training loop: L1 steps, metrics every ``train.log_every`` steps, validation, checkpoints."""
    forward = training.CompiledLoss(model, train_cfg, device)
    batch_size, steps = int(train_cfg.batch_size), int(train_cfg.steps)
    share = ddist.batch_share(batch_size, info)
    opt, sched = training.make_optimizer(model.parameters(), train_cfg, steps, device)
    average = training.WeightAverage.from_config(model, train_cfg)  # what checkpoints hold
    optimiser_step = training.GuardedStep(model, opt, sched, float(train_cfg.grad_clip), info, average)
    generator = torch.Generator(device=train_set.device).manual_seed(seed)
    run = TrainingRun(settings, info, opt, sched, average=average)
    streams = run.resume(lambda ckpt: check_and_load(model, load_weights(ckpt), str(ckpt)))
    if streams is not None:
        restore_generator(generator, streams["data_rng"], settings.resume_from, "data_rng")
    logger = run.open_logger(logged_config)
    bar, speed = run.progress(steps, progress), Throughput()
    try:
        for step, idx, batch in training_batches(train_set, batch_size, seed, run.start, steps, share):
            with training.autocast(device, train_cfg.amp):
                out = forward(model.action_normalizer.normalize(batch["actions"]), batch["action_mask"])
            # the L1 is a mean over unmasked actions, whose count differs between ranks' blocks
            grad_norm = optimiser_step(out["loss"], step, weight=batch["action_mask"].sum())
            speed.add(len(idx))
            bar.update(1)
            done = step + 1
            if due(train_cfg.log_every, done, steps):
                optimiser_step.check()
                sums = sum_by_name({"l1": out["l1"].item(), "loss": out["loss"].item()}, info)
                metrics = {**{f"train/{k}": v / info.world_size for k, v in sums.items()},
                           "train/grad_norm": float(grad_norm), "train/lr": sched.get_last_lr()[0],
                           "time/samples_per_s": speed.read(),
                           # codebook use of this rank's block of the batch
                           **{f"train/{k}": v
                              for k, v in codebook_metrics(out["indices"], model.codebook_size).items()}}
                logger.log(metrics, done)
                bar.set_postfix(l1=f"{metrics['train/l1']:.4f}", ppl=f"{metrics['train/perplexity']:.0f}")
            if val_set is not None and due(train_cfg.val_every, done, steps):
                optimiser_step.check()
                with training.averaged(average):
                    metrics = validate(model, val_set, batch_size, device, train_cfg.amp, info)
                logger.log(metrics, done)
                log.info("stage0 step %d: val l1 %.4f, codebook usage %.1f%%", done, metrics["val/l1"],
                         100 * metrics["val/codebook_usage"])
            stop = run.out_of_time()
            if due(train_cfg.save_every, done, steps) or stop:
                optimiser_step.check()  # a non-finite step since the last check: stop before anything is written
                run.save(done, model, ckpt_config, {"data_rng": generator.get_state()})
            if stop:
                run.stopped(done)
                break
        run.finish()
    finally:
        bar.close()
        run.close()
