"""``ript flow``: imitation of a flow-matching chunk policy (π0's recipe at a size trained here) from the task's
demonstrations, on the shared imitation scaffold; evaluated with the ODE in K Euler steps. No stage 0: the
policy predicts actions itself.

    ript flow task=libero_object algo=flow run_dir=runs/libero_object/flow
    ript flow task=libero_goal algo=flow init_checkpoint=runs/libero_90/flow   # from a base on other tasks
"""

from __future__ import annotations

import torch

from ript.errors import RiptError
from ript.model_loader import start_from
from ript.models.flow import FlowPolicyModel
from ript.models.flow_denoise import Denoising
from ript.policies.flow_policy import FlowPolicy
from ript.stages.imitation import augment_images, datasets, language, observation_kwargs, train_imitation
from ript.utils import distributed as ddist
from ript.utils import training
from ript.utils.logging import setup_console_logging
from ript.utils.run_dir import prepare_run_dir
from ript.utils.seeding import seed_everything

MODEL_KEYS = ("dim", "prefix_layers", "expert_layers", "n_head", "dropout", "encoder_width", "num_kp",
              "encoder_stages", "time_sampling")


def flow_sampling(algo) -> dict:
    """What a flow checkpoint records for its evaluations: the actions executed per decision, the Euler steps."""
    return {"action_horizon": int(algo.action_horizon), "denoise_steps": int(algo.denoise_steps)}


def run(cfg) -> str:
    setup_console_logging()
    device, info = ddist.init_rank(cfg.device)  # first: under torchrun, this rank's GPU
    if int(cfg.algo.action_horizon) > int(cfg.algo.chunk_size):
        raise RiptError(f"algo.action_horizon={cfg.algo.action_horizon} is more than algo.chunk_size="
                        f"{cfg.algo.chunk_size}: a decision executes at most its chunk")
    if cfg.train_expert_only and not cfg.init_checkpoint:
        raise RiptError("train_expert_only=true needs init_checkpoint: a fresh prefix and encoders would stay random")
    prepare_run_dir(cfg, create=False)  # fail fast, before loading data
    seed_everything(cfg.seed)
    train_set, val_set = datasets(cfg, int(cfg.algo.chunk_size), device)
    embeddings = language(cfg, train_set.instructions)
    kwargs = {**observation_kwargs(train_set, embeddings, int(cfg.algo.frame_stack)),
              "action_dim": int(cfg.task.action_dim), "chunk_size": int(cfg.algo.chunk_size),
              **{k: cfg.algo.model[k] for k in MODEL_KEYS}}
    model = FlowPolicyModel(**kwargs)
    metadata = {**train_set.metadata(cfg.task), "sampling": flow_sampling(cfg.algo)}
    if cfg.init_checkpoint:  # a base trained on other tasks: its normalisation too (its weights work in its units)
        metadata["init_checkpoint"] = start_from(model, kwargs, str(cfg.init_checkpoint), "flow", other_tasks=True)
        if cfg.train_expert_only:  # the optimiser and the trainable-parameter count take what still requires grad
            training.train_only(model, model.expert_parameters())
            metadata["train_expert_only"] = True
    else:
        model.fit_state_normalizers(train_set.obs)
        model.action_normalizer.fit(train_set.actions)
    model.set_task_embeddings(embeddings)
    return train_imitation(cfg, FlowObjective(model, cfg, device), model, kwargs, train_set, val_set, "flow",
                           metadata, device, info)


class FlowObjective:
    """The flow-matching loss on augmented images, its noise and times drawn from the data generator for the
    whole global batch (each rank takes its rows: the same step whatever the process count)."""
    model_name = "flow"
    metrics = ("mse",)

    def __init__(self, model: FlowPolicyModel, cfg, device: str):
        self.model, self.cfg = model, cfg
        self.loss_fn = training.CompiledLoss(model.loss, cfg.train, device)

    def _draws(self, batch: dict, generator: torch.Generator, share: slice | None, total: int):
        model, device = self.model, generator.device
        tau = model.draw_times(total, device, generator)
        noise = torch.randn((total, model.chunk_size, model.action_dim), device=device, generator=generator)
        rows = share if share is not None else slice(0, total)
        target = batch["actions"].device
        return noise[rows].to(target), tau[rows].to(target)

    def loss(self, batch: dict, generator: torch.Generator, share: slice | None) -> dict:
        obs = augment_images(batch["obs"], self.model.image_keys, self.cfg, generator, share)
        noise, tau = self._draws(batch, generator, share, int(self.cfg.train.batch_size))
        return self.loss_fn(obs, batch["task_ids"], batch["actions"], noise, tau, batch["action_mask"])

    def validation(self, batch: dict) -> dict[str, torch.Tensor]:
        # the same draws at every validation: the curve moves only with the model
        generator = torch.Generator(device=batch["actions"].device).manual_seed(len(batch["actions"]))
        noise, tau = self._draws(batch, generator, None, len(batch["actions"]))
        out = self.model.loss(batch["obs"], batch["task_ids"], batch["actions"], noise, tau, batch["action_mask"])
        return {"mse": out["mse"]}

    def policy(self, metadata: dict, device: str, seed: int, cuda_graph: bool) -> FlowPolicy:
        sampling = metadata["sampling"]
        return FlowPolicy(self.model, Denoising(steps=int(sampling["denoise_steps"])), int(sampling["action_horizon"]),
                          device, seed, amp=device.startswith("cuda"), cuda_graph=cuda_graph, deterministic=True)
