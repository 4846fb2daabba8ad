"""What a policy reads besides its own actions, encoded once for every model that conditions on it: the task (an
instruction embedding or a learned task table) and each frame's cameras and low-dim state as tokens."""

from __future__ import annotations

import torch
from torch import nn

from ript.data.normalize import Normalizer
from ript.errors import RiptError
from ript.models.encoders import MLPEncoder, ResNetEncoder


class ObservationConditioned(nn.Module):
    """A model conditioned on a task and a stack of observation frames; the skill prior and the flow policy
    subclass it (their weights keep these modules' names)."""

    def init_conditioning(self, task_names: list[str], image_keys: list[str], lowdim_dims: dict[str, int],
                          lang_dim: int | None, frame_stack: int, dim: int, encoder_width: int, num_kp: int,
                          encoder_stages: int) -> None:
        self.task_names = list(task_names)
        self.image_keys = list(image_keys)
        self.lowdim_keys = list(lowdim_dims)
        self.frame_stack = frame_stack
        self.image_encoders = nn.ModuleDict(
            {k: ResNetEncoder(dim, width=encoder_width, num_kp=num_kp, stages=encoder_stages) for k in self.image_keys}
        )
        self.lowdim_normalizers = nn.ModuleDict({k: Normalizer(d, "meanstd") for k, d in lowdim_dims.items()})
        self.lowdim_encoders = nn.ModuleDict({k: MLPEncoder(d, dim) for k, d in lowdim_dims.items()})
        self.uses_language = bool(lang_dim)
        if lang_dim:
            # instruction embeddings are data, not parameters: filled from the language cache, saved as buffers
            self.register_buffer("task_embeddings", torch.zeros(len(task_names), lang_dim))
            self.task_proj = nn.Linear(lang_dim, dim)
        else:
            self.task_table = nn.Embedding(len(task_names), dim)
        self.observation_tokens = 1 + frame_stack * (len(self.image_keys) + len(self.lowdim_keys))

    def task_index(self, name: str) -> int:
        if name not in self.task_names:
            raise RiptError(f"task {name!r} is not one this model was trained on ({', '.join(self.task_names)})")
        return self.task_names.index(name)

    def observation_context(self, obs: dict[str, torch.Tensor], task_ids: torch.Tensor) -> torch.Tensor:
        """Obs tensors (B, frame_stack, ...) and task ids (B,) -> tokens (B, 1 + frames * keys, dim): the task,
        then frame by frame each camera and each low-dim key."""
        task = self.task_proj(self.task_embeddings[task_ids]) if self.uses_language else self.task_table(task_ids)
        per_key = []
        for k in self.image_keys:
            img = obs[k]
            b, f = img.shape[:2]
            per_key.append(self.image_encoders[k](img.flatten(0, 1)).view(b, f, -1))
        for k in self.lowdim_keys:
            per_key.append(self.lowdim_encoders[k](self.lowdim_normalizers[k].normalize(obs[k].float())))
        frames = torch.stack(per_key, dim=2).flatten(1, 2)  # (B, frames * keys, dim), frame-major
        return torch.cat([task.unsqueeze(1), frames], dim=1)

    def set_task_embeddings(self, embeddings: torch.Tensor | None) -> None:
        """The instructions' embeddings (None: a model with a learned task table)."""
        if embeddings is not None:
            self.task_embeddings.copy_(embeddings)

    def fit_state_normalizers(self, obs: dict[str, torch.Tensor]) -> None:
        for k in self.lowdim_keys:
            self.lowdim_normalizers[k].fit(obs[k])
