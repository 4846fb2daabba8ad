"""π0 behind the runners' policy interface: the flow policy's denoising and RL recording on openpi's inputs.

Inputs as openpi's LIBERO and MetaWorld policies build them: each camera's upright frame resized to the vision
tower's size and scaled to [-1, 1]; the prompt ``BOS + instruction + "\\n"`` in at most ``max_token_len`` tokens;
the state (the ``state_keys`` concatenated) z-scored with the checkpoint's statistics and padded to the model's
action width. Actions: the first ``action_dim`` of the chunk's dims, un-normalised, the first ``delta_dims``
relative to the state (openpi's LIBERO policy predicts the arm's motion from the current pose)."""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

from ript.errors import RiptError
from ript.models.flow_denoise import Denoising
from ript.models.pi0.model import Pi0Model
from ript.policies.flow_policy import FlowPolicy


def prompt_tokens(tokenizer, instruction: str, length: int) -> tuple[list[int], list[bool]]:
    """openpi's π0 prompt: BOS, the cleaned instruction, a newline; padded with 0 to ``length`` (or cut)."""
    text = instruction.strip().replace("_", " ").replace("\n", " ")
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    ids = bos + tokenizer.encode(text, add_special_tokens=False) + tokenizer.encode("\n", add_special_tokens=False)
    ids = ids[:length]
    return ids + [0] * (length - len(ids)), [True] * len(ids) + [False] * (length - len(ids))


class Pi0Policy(FlowPolicy):
    def __init__(self, model: Pi0Model, tokenizer, stats: dict, instructions: dict[str, str], policy_cfg,
                 denoising: Denoising, action_horizon: int, action_dim: int, device="cpu", seed: int = 0,
                 amp: bool = False, cuda_graph: bool = True, deterministic: bool = True):
        self.image_keys, self.state_keys = list(policy_cfg.image_keys), list(policy_cfg.state_keys)
        self.delta_dims = int(policy_cfg.delta_dims)
        self.env_dim = action_dim
        if not 0 <= self.delta_dims <= action_dim <= model.action_dim:
            raise RiptError(f"policy.delta_dims={self.delta_dims} and the task's action_dim={action_dim} must fit "
                            f"the checkpoint's action_dim={model.action_dim}")
        self.tasks = list(instructions)
        rows = [prompt_tokens(tokenizer, instructions[t], int(policy_cfg.max_token_len)) for t in self.tasks]
        self.token_table = torch.tensor([r[0] for r in rows], device=device)
        self.token_masks = torch.tensor([r[1] for r in rows], device=device)
        self.state_mean, self.state_std = (stats["state"][k].to(device) for k in ("mean", "std"))
        self.action_mean, self.action_std = (stats["actions"][k].to(device) for k in ("mean", "std"))
        super().__init__(model, denoising, action_horizon, device, seed, amp, cuda_graph, deterministic,
                         str(policy_cfg.eval_noise), action_dim, 1, self.image_keys + self.state_keys)

    def start_task(self, i: int, task_name: str) -> None:
        # a π0 model holds no task list: the policy's own instructions index the prompts
        if task_name not in self.tasks:
            raise RiptError(f"no instruction known for task {task_name!r}")
        self.task_ids[i] = self.tasks.index(task_name)

    def observe(self, i: int, obs: dict[str, np.ndarray]) -> None:
        missing = [k for k in self.image_keys + self.state_keys if k not in obs]
        if missing:
            raise RiptError(f"observation has no {missing[0]!r} (has: {', '.join(sorted(obs))}); set "
                            f"policy.image_keys / policy.state_keys")
        super().observe(i, obs)

    def model_inputs(self, obs: dict[str, torch.Tensor], task_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        size = self.model.image_size
        images = []
        for k in self.image_keys:
            frames = obs[k][:, -1].permute(0, 3, 1, 2).float()  # the current frame, (B, 3, H, W)
            frames = F.interpolate(frames, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
            images.append(frames / 127.5 - 1.0)
        state = torch.cat([obs[k][:, -1].float() for k in self.state_keys], dim=-1)
        if state.shape[-1] != len(self.state_mean):
            raise RiptError(f"policy.state_keys give a {state.shape[-1]}-dim state; the checkpoint's norm_stats "
                            f"state has {len(self.state_mean)} dims")
        z = (state - self.state_mean) / (self.state_std + 1e-6)
        return {"images": torch.stack(images, 1), "image_masks": torch.ones(len(state), len(images), dtype=torch.bool,
                                                                            device=state.device),
                "tokens": self.token_table[task_ids], "token_masks": self.token_masks[task_ids],
                "state": F.pad(z, (0, self.model.action_dim - z.shape[-1]))}

    def env_actions(self, chunks: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        a = chunks[:, : self.action_horizon, : self.env_dim] * (self.action_std[: self.env_dim] + 1e-6) \
            + self.action_mean[: self.env_dim]
        if self.delta_dims:
            state = inputs["state"][:, : len(self.state_mean)] * (self.state_std + 1e-6) + self.state_mean
            a = torch.cat([a[..., : self.delta_dims] + state[:, None, : self.delta_dims], a[..., self.delta_dims:]], -1)
        return a
