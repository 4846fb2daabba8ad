"""``ript world-model``: a world model of the task's suite trained on its demonstrations (``ript.models.world_model``),
on the shared imitation scaffold (checkpoints, exact resume, validation, torchrun). RL then runs in it instead of
the simulator (``ript rl environment=world_model environment.checkpoint=<this run>``).

    ript world-model task=libero_object algo=world_model run_dir=runs/libero_object/world_model
"""

from __future__ import annotations

import torch

from ript.config import extra_data_files, task_names
from ript.errors import RiptError
from ript.model_loader import start_from
from ript.models.world_model import WorldModel
from ript.stages.imitation import datasets, language, observation_kwargs, train_imitation
from ript.utils import distributed as ddist
from ript.utils import training
from ript.utils.logging import setup_console_logging
from ript.utils.run_dir import prepare_run_dir
from ript.utils.seeding import seed_everything

MODEL_KEYS = ("width", "stages", "cond_dim", "success_weight", "motion_weight", "output", "denoise_steps",
              "cond_noise", "state_head", "feed_back")


def run(cfg) -> str:
    setup_console_logging()
    device, info = ddist.init_rank(cfg.device)  # first: under torchrun, this rank's GPU
    prepare_run_dir(cfg, create=False)  # fail fast, before loading data
    seed_everything(cfg.seed)
    chunk, unroll = int(cfg.algo.chunk), int(cfg.algo.unroll)
    extra = extra_data_files(task_names(cfg.task), list(cfg.data.extra_dirs))  # a policy's recorded episodes
    train_set, val_set = datasets(cfg, chunk * unroll, device, extra, future_every=chunk, future_count=unroll)
    embeddings = language(cfg, train_set.instructions)
    conditioning = observation_kwargs(train_set, embeddings, 1)
    sizes = {train_set.obs_shapes()[k][0] for k in conditioning["image_keys"]}
    if len(sizes) != 1:
        raise RiptError(f"world model: the cameras {', '.join(conditioning['image_keys'])} have different image "
                        f"sizes; it predicts them at one size")
    kwargs = {**{k: conditioning[k] for k in ("task_names", "image_keys", "lowdim_dims", "lang_dim")},
              "image_size": sizes.pop(), "action_dim": int(cfg.task.action_dim), "chunk": chunk,
              **{k: cfg.algo.model[k] for k in MODEL_KEYS}}
    if int(cfg.algo.state_steps) and (cfg.algo.model.state_head != "dynamics" or not kwargs["lowdim_dims"]):
        raise RiptError(f"algo.state_steps={cfg.algo.state_steps} trains a state network of its own: it needs "
                        f"algo.model.state_head=dynamics (not {cfg.algo.model.state_head}) and a low-dim state")
    model = WorldModel(**kwargs)
    model.set_task_embeddings(embeddings)
    if cfg.init_checkpoint:  # go on from a world model (its normalisation too: what it has learnt is in its units)
        start_from(model, kwargs, str(cfg.init_checkpoint), "world_model")
    else:
        model.fit_normalizers(train_set.obs, train_set.actions)
    metadata = {**train_set.metadata(cfg.task), "world_model": {"chunk": chunk, "unroll": unroll}}
    return train_imitation(cfg, WorldModelObjective(model, cfg, device, train_set), model, kwargs, train_set, val_set,
                           "world_model", metadata, device, info)


class WorldModelObjective:
    """The unrolled prediction loss (pixels, state, success) on the demos' own frames; a diffusion model's noise is
    drawn here, for the whole global batch, so that every rank's share is the same as in one process."""
    model_name = "world_model"

    def __init__(self, model: WorldModel, cfg, device: str, train_set):
        self.model, self.batch_size = model, int(cfg.train.batch_size)
        self.metrics = (*model.pixel_metrics, "success_bce", "state_mse", "state_steps_mse")
        self.loss_fn = training.CompiledLoss(model.loss, cfg.train, device)
        # steps of the state alone for a dynamics head, the same draws on every rank (their gradients average to
        # one process's)
        self.state_steps, self.train_set = int(cfg.algo.state_steps), train_set

    def draws(self, batch: dict, generator: torch.Generator, share: slice | None, total: int) -> dict | None:
        drawn = self.model.diffusion_draws(total, batch["future_done"].shape[1], generator.device, generator)
        if drawn is None:
            return None
        rows, target = share if share is not None else slice(0, total), batch["actions"].device
        return {k: v[rows].to(target) for k, v in drawn.items()}

    def loss(self, batch: dict, generator: torch.Generator, share: slice | None) -> dict:
        out = self.loss_fn(batch["obs"], batch["future_obs"], batch["future_done"], batch["actions"],
                           batch["task_ids"], self.draws(batch, generator, share, self.batch_size))
        if not self.state_steps:
            return out
        steps = self.train_set.state_steps(self.state_steps, self.model.chunk, self.model.lowdim_keys, generator)
        extra = self.model.state_steps_loss(steps["obs"], steps["next_obs"], steps["actions"], steps["task_ids"])
        return {**out, "loss": out["loss"] + extra, "state_steps_mse": extra}

    def validation(self, batch: dict) -> dict[str, torch.Tensor]:
        # the same draws at every validation: the curve moves only with the model
        generator = torch.Generator(device=batch["actions"].device).manual_seed(len(batch["actions"]))
        draws = self.draws(batch, generator, None, len(batch["actions"]))
        out = self.model.loss(batch["obs"], batch["future_obs"], batch["future_done"], batch["actions"],
                              batch["task_ids"], draws)
        return {k: out[k] for k in self.metrics if k in out}

    def policy(self, metadata: dict, device: str, seed: int, cuda_graph: bool):
        raise RiptError("a world model has no policy to evaluate in the simulator (eval.every must stay 0)")
