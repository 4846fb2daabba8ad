"""Stage 1 (autoregressive prior over skill tokens) and stage 2 (few-shot fine-tuning on new tasks).

Both train a ``SkillPrior`` with teacher-forced cross-entropy; fine-tuning starts from a stage-1
checkpoint, swaps in the new tasks' embeddings, and may also train the decoder with an L1 term.
"""

from __future__ import annotations

import torch

from ript.config import to_dict
from ript.errors import RiptError
from ript.model_loader import PER_TASK_WEIGHTS, load_model
from ript.models.prior import SkillPrior
from ript.policies.build import make_policy, sampling_settings, stage1_sampling
from ript.stages.imitation import augment_images, datasets, language, observation_kwargs, train_imitation
from ript.utils import distributed as ddist
from ript.utils import training
from ript.utils.logging import setup_console_logging
from ript.utils.run_dir import covered, flatten, prepare_run_dir
from ript.utils.seeding import seed_everything


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
    train_set, val_set = datasets(cfg, autoencoder.chunk_size, device)
    embeddings = language(cfg, train_set.instructions)
    kwargs = {
        "autoencoder": ae_ckpt["model_kwargs"],
        **observation_kwargs(train_set, embeddings, int(cfg.algo.frame_stack)),
        **dict(cfg.algo.prior),
    }
    model = SkillPrior(**kwargs)
    model.autoencoder.load_state_dict(autoencoder.state_dict())
    model.set_task_embeddings(embeddings)
    model.fit_state_normalizers(train_set.obs)
    metadata = {**train_set.metadata(cfg.task), "stage0_checkpoint": ae_ckpt["checkpoint_dir"],
                "sampling": stage1_sampling(cfg.algo)}
    return train_imitation(cfg, PriorObjective(model, cfg, device), model, kwargs, train_set, val_set, "stage1",
                           metadata, device, info)


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
    train_set, val_set = datasets(cfg, base.autoencoder.chunk_size, device)
    embeddings = language(cfg, train_set.instructions)
    kwargs = {**base_ckpt["model_kwargs"], "task_names": train_set.task_names}
    if (embeddings is None) != (kwargs["lang_dim"] is None):
        raise RiptError(f"lang.encoder={cfg.lang.encoder!r} does not match the checkpoint's task conditioning")
    model = SkillPrior(**kwargs)
    # everything but the per-task conditioning carries over from the base model
    state = {k: v for k, v in base.state_dict().items() if not k.startswith(PER_TASK_WEIGHTS)}
    model.load_state_dict(state, strict=False)
    model.set_task_embeddings(embeddings)
    if float(cfg.decoder_l1_weight) > 0:
        for part in (model.autoencoder.from_code, model.autoencoder.decoder, model.autoencoder.out,
                     model.autoencoder.dec_queries, model.autoencoder.dec_mem_pos):
            part.requires_grad_(True)
    # the replanning and sampling the base was trained for (equal to cfg.algo's, _check_base_algo saw to it)
    sampling = base_ckpt.get("metadata", {}).get("sampling") or stage1_sampling(cfg.algo)
    metadata = {**train_set.metadata(cfg.task), "base_checkpoint": base_ckpt["checkpoint_dir"], "sampling": sampling}
    return train_imitation(cfg, PriorObjective(model, cfg, device), model, kwargs, train_set, val_set,
                           "finetune", metadata, device, info)


# algo keys fine-tuning applies itself; every other one is the base checkpoint's (architecture, replanning)
FINETUNE_OWN_ALGO_KEYS = ("image_aug_pad", "image_aug_color")


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
    obs = augment_images(batch["obs"], model.image_keys, cfg, generator, share)
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


class PriorObjective:
    """Stage 1's and fine-tuning's objective: token cross-entropy (with the decoder's L1 term when fine-tuning
    trains the decoder); evaluations decode with the sampling settings the checkpoint records."""
    model_name = "skill_prior"
    metrics = ("ce", "token_acc", "decoder_l1")

    def __init__(self, model: SkillPrior, cfg, device: str):
        self.model, self.cfg = model, cfg
        self.loss_fn = training.CompiledLoss(model.loss, cfg.train, device)
        self.decoder_l1_weight = float(cfg.get("decoder_l1_weight", 0.0))

    def loss(self, batch: dict, generator: torch.Generator, share: slice | None) -> dict:
        return prior_loss(self.model, batch, self.cfg, generator, self.decoder_l1_weight, self.loss_fn, share)

    def validation(self, batch: dict) -> dict[str, torch.Tensor]:
        out = self.model.loss(batch["obs"], batch["task_ids"], batch["actions"])
        return {"ce": out["ce"], "token_acc": out["token_acc"]}

    def policy(self, metadata: dict, device: str, seed: int, cuda_graph: bool):
        return make_policy(self.model, sampling_settings(metadata), device, seed, cuda_graph)
