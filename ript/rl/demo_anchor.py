"""An imitation term in RL's update (``rl.demo_coef``): the flow-matching loss on the demos the checkpoint learnt
from, added at every optimiser step. The tasks of a multi-task policy share its weights, so an update driven by
some tasks' groups moves the others' actions unscored (docs/flow.md); the demos pull every task's velocity field
back toward what imitation taught, at every flow time, where the ratio of one scored step sees little."""

from __future__ import annotations

import torch

from ript.data.dataset import ChunkDataset, reread_spec
from ript.errors import RiptError
from ript.utils import training


def demo_coef(rl_cfg) -> float:
    """``rl.demo_coef`` (0: off; absent from configs written before it)."""
    return float(rl_cfg.get("demo_coef") or 0)


class DemoAnchor:
    """Draws ``rl.demo_batch`` chunks of the checkpoint's training split and their flow noise and times from a
    generator seeded by (run seed, iteration, optimiser step), so a resumed run draws what the uninterrupted one
    did; gives their flow-matching loss under the update's autocast."""

    def __init__(self, model, metadata: dict, cfg, device: str):
        if "reading" not in metadata:
            raise RiptError(f"rl.demo_coef={cfg.rl.demo_coef}: the checkpoint's metadata does not record how its demos "
                            f"were read (a checkpoint written before it); leave rl.demo_coef at 0")
        self.data = ChunkDataset(reread_spec(metadata), "train")  # a missing or damaged file is refused by name
        if device.startswith("cuda"):
            self.data.serve_to(device)  # a batch per optimiser step, copied from host memory
        # the model's own task indices (RL may run a subset of its tasks; the demos cover all it learnt)
        index = torch.tensor([model.task_index(name) for name in self.data.task_names])
        self.task_ids = index[self.data.task_ids]
        self.model, self.cfg, self.device = model, cfg, device
        self.coef, self.batch = demo_coef(cfg.rl), int(cfg.rl.demo_batch)
        self.seed = int(cfg.seed)

    def loss(self, iteration: int, step: int) -> torch.Tensor:
        """The flow-matching loss of one batch of demo chunks, drawn for (iteration, optimiser step)."""
        model = self.model
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + iteration) * 1_000_003 + step)
        idx = torch.randint(len(self.data), (self.batch,), generator=g)
        noise = torch.randn((self.batch, model.chunk_size, model.action_dim), generator=g)
        tau = model.draw_times(self.batch, "cpu", g)
        batch = self.data.get_batch(idx)  # on the device already (``serve_to``)
        dev = self.device
        with training.autocast(dev, self.cfg.amp):
            out = model.loss(batch["obs"], self.task_ids[idx].to(dev), batch["actions"], noise.to(dev), tau.to(dev),
                             batch["action_mask"])
        return out["loss"].float()


def demo_anchor(learner, metadata: dict, cfg, device: str, sharded: bool) -> DemoAnchor | None:
    """The run's demo term (``rl.demo_coef`` > 0), or None; refused where the learner's model has no imitation loss
    of its own or is sharded."""
    coef = demo_coef(cfg.rl)
    if coef == 0:
        return None
    if not learner.imitates_demos:
        raise RiptError(f"rl.demo_coef={coef}: {type(learner).__name__}'s model was not trained here on demos "
                        f"(flow policies are); leave it at 0")
    if sharded:
        raise RiptError(f"rl.demo_coef={coef} with rl.fsdp=true: the demo term runs on the whole model only")
    return DemoAnchor(learner.model, metadata, cfg, device)
