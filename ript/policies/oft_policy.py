"""OpenVLA-OFT behind the runners' policy interface: one batched forward per decision for every env that
needs a new chunk; deterministic (the L1 head's mean, as OFT evaluates) or sampled from the Laplace head
for RL, recording what PPO needs to rescore the same distribution.

Inputs follow OFT's LIBERO evaluation: upright third-person and wrist images resized to the towers' size
(optionally a centre crop of 90% of the area first), proprio = end-effector position, axis-angle and the
two gripper joints, normalised to [-1, 1] with the checkpoint's q01/q99; the prompt
``In: What action should the robot take to {instruction}?\\nOut:``; actions un-normalised with q01/q99
where the statistics' mask says so, and LIBERO's gripper convention (+1 close, -1 open).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

from ript.errors import RiptError
from ript.models.openvla_oft.model import OpenVLAOFT, laplace_log_prob
from ript.policies.base import ChunkingPolicy

PROMPT = "In: What action should the robot take to {}?\nOut:"


def prompt_ids(tokenizer, instruction: str) -> list[int]:
    """Token ids of OFT's prompt, BOS first, ending with the empty '▁' token OFT appends after 'Out:'."""
    ids = list(tokenizer(PROMPT.format(instruction.lower()))["input_ids"])
    empty = tokenizer.convert_tokens_to_ids("▁")
    if ids[-1] != empty:
        ids.append(empty)
    return ids


def assemble_text(prompts: list[list[int]], action_tokens: int, eos: int,
                  pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, valid) of [BOS][pads][prompt][action placeholders][EOS]; pads sit right after BOS so the
    image tokens (inserted after BOS) and the action block keep fixed positions in the batch."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width + action_tokens + 1), pad, dtype=torch.long)
    valid = torch.zeros(ids.shape, dtype=torch.bool)
    for r, p in enumerate(prompts):
        start = 1 + width - len(p)
        ids[r, 0], ids[r, start:width] = p[0], torch.tensor(p[1:], dtype=torch.long)
        valid[r, 0], valid[r, start:] = True, True
    ids[:, width: width + action_tokens] = 1  # any id: these embeddings are zeroed
    ids[:, -1] = eos
    return ids, valid


def resize_images(frames: torch.Tensor, size: int, center_crop: bool) -> torch.Tensor:
    """uint8 (N, H, W, 3) -> uint8 (N, 3, size, size). Rounded to uint8, so that RL training rescores the
    very inputs the rollout saw."""
    x = frames.permute(0, 3, 1, 2).float()
    if center_crop:  # OFT trains with random crops of 90% of the area and evaluates on the centre one
        h, w = x.shape[-2:]
        ch, cw = round(h * 0.9 ** 0.5), round(w * 0.9 ** 0.5)
        top, left = (h - ch) // 2, (w - cw) // 2
        x = x[..., top: top + ch, left: left + cw]
    x = F.interpolate(x, size=(size, size), mode="bicubic", antialias=True, align_corners=False)
    return x.round().clamp(0, 255).to(torch.uint8)


class Normalizer:
    """q01/q99 bounds to and from [-1, 1], on the dims the statistics' mask selects."""

    def __init__(self, entry: dict):
        self.low, self.high = np.asarray(entry["q01"], np.float32), np.asarray(entry["q99"], np.float32)
        self.mask = np.asarray(entry.get("mask", [True] * len(self.low)), bool)

    def normalize(self, x: np.ndarray) -> np.ndarray:
        y = 2 * (x - self.low) / (self.high - self.low + 1e-8) - 1
        return np.clip(np.where(self.mask, y, x), -1, 1)

    def unnormalize(self, y: np.ndarray) -> np.ndarray:
        return np.where(self.mask, 0.5 * (y + 1) * (self.high - self.low + 1e-8) + self.low, y)


class OFTPolicy(ChunkingPolicy):
    def __init__(self, model: OpenVLAOFT, tokenizer, statistics: dict, instructions: dict[str, str],
                 image_keys: list[str], proprio_keys: list[str], device: str | torch.device = "cpu",
                 action_horizon: int | None = None, center_crop: bool = True, gripper: str = "libero",
                 sample: bool = False, seed: int = 0, amp: bool = True):
        cfg = model.cfg
        if len(image_keys) != cfg.num_images:
            raise RiptError(f"the checkpoint takes {cfg.num_images} images; policy.image_keys names {len(image_keys)}")
        if gripper not in ("libero", "none"):
            raise RiptError(f"policy.gripper must be 'libero' or 'none', not {gripper!r}")
        self.model, self.tokenizer = model, tokenizer
        # OFT reads the current observation only (frame stack 1) and executes whole chunks open-loop by default
        super().__init__(cfg.action_dim, action_horizon or cfg.chunk_size, 1, device, seed,
                         obs_keys=list(image_keys) + list(proprio_keys))
        self.actions = Normalizer(statistics["action"])
        self.proprio = Normalizer(statistics["proprio"]) if cfg.proprio_dim else None
        self.instructions, self.image_keys, self.proprio_keys = instructions, image_keys, proprio_keys
        self.chunk = cfg.chunk_size
        self.center_crop, self.gripper = center_crop, gripper
        self.set_deterministic(not sample)  # the L1 head's mean, as OFT evaluates
        self.amp = amp and self.device.type == "cuda"
        self._prompts: dict[str, list[int]] = {}
        self.eos = tokenizer.eos_token_id
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos

    def reset(self, n_envs: int, block: int | None = None) -> None:
        super().reset(n_envs, block)
        self.tasks: list[str] = [""] * n_envs

    def start_task(self, i: int, task_name: str) -> None:
        if task_name not in self.instructions:
            raise RiptError(f"no instruction known for task {task_name!r}")
        self.tasks[i] = task_name
        if task_name not in self._prompts:
            self._prompts[task_name] = prompt_ids(self.tokenizer, self.instructions[task_name])

    def observe(self, i: int, obs: dict[str, np.ndarray]) -> None:
        missing = [k for k in self.obs_keys if k not in obs]
        if missing:
            raise RiptError(f"observation has no {missing[0]!r} (has: {', '.join(sorted(obs))}); "
                            f"set policy.image_keys / policy.proprio_keys")
        super().observe(i, obs)

    def inputs(self, envs: list[int]) -> dict:
        """The model inputs of these envs' current observations (uint8 images, normalised proprio, prompts)."""
        obs = [self.history[i][-1] for i in envs]
        frames = torch.from_numpy(np.stack([o[k] for o in obs for k in self.image_keys])).to(self.device)
        images = resize_images(frames, self.model.cfg.image_size, self.center_crop)
        images = images.reshape(len(envs), len(self.image_keys), *images.shape[1:])
        proprio = None
        if self.proprio is not None:
            raw = np.stack([np.concatenate([np.asarray(o[k], np.float32).ravel() for k in self.proprio_keys])
                            for o in obs])
            if raw.shape[1] != self.model.cfg.proprio_dim:
                raise RiptError(f"proprio from {self.proprio_keys} has {raw.shape[1]} dims; the checkpoint's "
                                f"proprio projector takes {self.model.cfg.proprio_dim}")
            proprio = torch.from_numpy(self.proprio.normalize(raw).astype(np.float32))
        return {"images": images, "proprio": proprio, "prompts": [self._prompts[self.tasks[i]] for i in envs]}

    def forward(self, inputs: dict, **kw) -> dict[str, torch.Tensor]:
        ids, valid = assemble_text(inputs["prompts"], self.model.action_tokens, self.eos, self.pad)
        proprio = inputs["proprio"]
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
            return self.model(inputs["images"].to(self.device), None if proprio is None else proprio.to(self.device),
                              ids.to(self.device), valid.to(self.device), **kw)

    @torch.no_grad()
    def plan(self, envs: list[int]) -> np.ndarray:
        inputs = self.inputs(envs)
        out = self.forward(inputs)
        mean = out["mean"]
        if not self.deterministic and "scale" not in out:
            raise RiptError("sampling needs the Laplace scale head (model.add_scale_head())")
        if not self.deterministic:
            u = self.env_draws(envs, lambda g: torch.rand(mean.shape[1:], generator=g, device=mean.device)) - 0.5
            noise = -torch.sign(u) * torch.log1p(-2 * u.abs())  # standard Laplace by inversion
            actions = mean + out["scale"] * noise
            log_probs = laplace_log_prob(actions, mean, out["scale"]).flatten(1)
        else:
            actions = mean
        values = None if self.critic is None else self.critic(out["hidden"])
        if self.record:
            for j, i in enumerate(envs):
                self.records[i].append({"images": inputs["images"][j].cpu(),
                                        "proprio": None if inputs["proprio"] is None else inputs["proprio"][j],
                                        "prompt": inputs["prompts"][j], "actions": actions[j].float().cpu(),
                                        "log_probs": None if self.deterministic else log_probs[j].float().cpu()})
                if values is not None:
                    self.records[i][-1]["value"] = values[j].float().cpu()
        return self.to_env(actions.float().cpu().numpy())

    def state_values(self, envs: list[int]) -> torch.Tensor:
        return self.critic(self.forward(self.inputs(envs))["hidden"])

    def to_env(self, normalized: np.ndarray) -> np.ndarray:
        a = self.actions.unnormalize(np.clip(normalized, -1, 1))
        if self.gripper == "libero":  # OFT predicts 0 = close .. 1 = open; LIBERO takes +1 = close
            a[..., -1] = -np.sign(2 * a[..., -1] - 1)
        return a.astype(np.float32)
