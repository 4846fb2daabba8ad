"""A world model that stands in for the simulator in RL: from the current observation (every camera at the
policy's resolution and the robot state), the task and an executed run of ``chunk`` actions, the observation
after those actions and whether they finished the task.

Pixel space, one prediction per chunk: a U-Net over the cameras stacked as channels predicts each camera's
change (or a flow field to warp it along), FiLM-conditioned on the actions, the state and the task; the state's
change and the success logit come from its pooled bottleneck. Trained with L1 on pixels, MSE on the normalised
state and a weighted cross-entropy on success, over an unroll of a few chunks in which each prediction is fed back
as the next input (so training sees the errors imagination makes). A regressed frame blurs what the model is not
sure of; a denoiser (``ript.models.world_model_diffusion``) can draw the frame instead, or draw what the regressed
frame lacks on top of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ript.data.normalize import Normalizer
from ript.errors import RiptError
from ript.models.conditioned_unet import ConditionedUNet
from ript.models.world_model_diffusion import ChangeDenoiser
from ript.registry import MODELS

MOVED_LEVELS = 5  # of 255: a pixel one of whose channels changes by more moved (rendering is deterministic)
# per output: what the regressing U-Net predicts per camera (the pixels' change; or where each pixel comes from, a
# flow field the frame is resampled along so that what moves keeps its texture, and a change added after it; or
# nothing), and whether a denoiser then draws the frame (ript/models/world_model_diffusion.py) from the current
# frame or from the regressed one
OUTPUTS = {"change": ("change", False), "warp": ("warp", False), "diffusion": (None, True),
           "warp_diffusion": ("warp", True)}
MAP_CHANNELS = {"change": 3, "warp": 5}  # the regressing U-Net's output channels per camera
# what the state's change is read from: the U-Net's pooled bottleneck beside the conditioning vector it shares with
# the frame (bottleneck), or a network of its own over the normalised state, the actions and the task as they are,
# learning from the state's error alone (dynamics: the arm's motion is the actions' far more than the frame's; on
# LIBERO-Object its error was 17-29% lower over 1-8 chunks, 31-41% with algo.state_steps, docs/world_model.md)
STATE_HEADS = ("bottleneck", "dynamics")
# what the next chunk of a training unroll starts from (a regressing model): its regressed frame, or for
# warp_diffusion the frame drawn on it, which is what imagination feeds back
FEED_BACK = ("regressed", "drawn")


def warp(images: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
    """Each camera's image (B, cameras*3, H, W) resampled at its pixels moved by ``flow`` (B, cameras*2, H, W), in
    units of the image's half-width (grid_sample's coordinates); zero flow gives the image back."""
    b, c, h, w = images.shape
    cams = c // 3
    ys, xs = torch.meshgrid(torch.linspace(-1 + 1 / h, 1 - 1 / h, h, device=images.device),
                            torch.linspace(-1 + 1 / w, 1 - 1 / w, w, device=images.device), indexing="ij")
    grid = torch.stack([xs, ys], dim=-1).to(flow.dtype)  # (H, W, 2), x first as grid_sample reads it
    offsets = flow.reshape(b * cams, 2, h, w).permute(0, 2, 3, 1)
    out = F.grid_sample(images.reshape(b * cams, 3, h, w), grid + offsets, mode="bilinear",
                        padding_mode="border", align_corners=False)
    return out.reshape(b, c, h, w)


@dataclass
class Imagined:
    """One predicted step: images in [-1, 1] (B, cameras*3, H, W), the normalised state (B, S), success logits (B,),
    and what the state and success heads read (B, F): the pooled bottleneck beside the conditioning vector."""
    images: torch.Tensor
    state: torch.Tensor
    success_logit: torch.Tensor
    head_in: torch.Tensor


@MODELS.register("world_model")
class WorldModel(nn.Module):
    stage = "world_model"

    def __init__(self, task_names: list[str], image_keys: list[str], lowdim_dims: dict[str, int], image_size: int,
                 action_dim: int, chunk: int, lang_dim: int | None = 384, width: int = 64, stages: int = 3,
                 cond_dim: int = 256, success_weight: float = 5.0, motion_weight: float = 0.0,
                 output: str = "change", denoise_steps: int = 3, cond_noise: float = 0.0,
                 state_head: str = "bottleneck", feed_back: str = "regressed"):
        super().__init__()
        if not image_keys:
            raise RiptError("world model: the data has no camera images to predict")
        self.task_names, self.image_keys, self.lowdim_keys = list(task_names), list(image_keys), list(lowdim_dims)
        self.lowdim_dims = dict(lowdim_dims)
        self.image_size, self.action_dim, self.chunk = image_size, action_dim, chunk
        self.success_weight, self.motion_weight = success_weight, motion_weight
        if output not in OUTPUTS:
            raise RiptError(f"world model: algo.model.output={output!r} is not one of {', '.join(OUTPUTS)}")
        self.regressed, drawn = OUTPUTS[output]
        if state_head not in STATE_HEADS:
            raise RiptError(f"world model: algo.model.state_head={state_head!r} is not one of {', '.join(STATE_HEADS)}")
        self.state_from = state_head
        if feed_back not in FEED_BACK or (feed_back == "drawn" and output != "warp_diffusion"):
            raise RiptError(f"world model: algo.model.feed_back={feed_back!r} with output={output!r}: 'regressed', or "
                            f"'drawn' for warp_diffusion (the only output that both regresses and draws)")
        self.feed_back = feed_back
        state_dim = sum(lowdim_dims.values())
        self.action_normalizer = Normalizer(action_dim, "minmax")
        self.state_normalizer = Normalizer(max(state_dim, 1), "meanstd")
        self.uses_language = bool(lang_dim)
        if lang_dim:
            self.register_buffer("task_embeddings", torch.zeros(len(task_names), lang_dim))
            self.task_proj = nn.Linear(lang_dim, cond_dim)
        else:
            self.task_table = nn.Embedding(len(task_names), cond_dim)
        self.cond = nn.Sequential(nn.Linear(chunk * action_dim + state_dim + cond_dim, cond_dim), nn.SiLU(),
                                  nn.Linear(cond_dim, cond_dim), nn.SiLU())
        channels = 3 * len(image_keys)
        self.unet = (ConditionedUNet(channels, width, stages, cond_dim, MAP_CHANNELS[self.regressed] * len(image_keys))
                     if self.regressed else None)
        # the current frame noised by up to cond_noise in training, so that it learns to read frames as imperfect as
        # its own; what it draws on the regressed frame also reads that frame
        self.denoiser = (ChangeDenoiser(channels, 2 if self.regressed else 1, width, stages, cond_dim, denoise_steps,
                                        cond_noise) if drawn else None)
        pooled = (self.unet or self.denoiser.unet).bottleneck_width + cond_dim
        inputs = chunk * action_dim + state_dim + cond_dim  # what the conditioning vector is made from
        self.state_head = (nn.Sequential(nn.Linear(pooled, cond_dim), nn.SiLU(), nn.Linear(cond_dim, state_dim))
                           if state_head == "bottleneck" else
                           nn.Sequential(nn.Linear(inputs, cond_dim), nn.SiLU(),
                                         nn.Linear(cond_dim, cond_dim), nn.SiLU(), nn.Linear(cond_dim, state_dim)))
        self.success_head = nn.Sequential(nn.Linear(pooled, cond_dim), nn.SiLU(), nn.Linear(cond_dim, 1))

    @property
    def sampling_steps(self) -> int | None:
        """Denoising network calls per imagined chunk (None: the frame is regressed in one call)."""
        return None if self.denoiser is None else self.denoiser.edm.steps

    def set_denoise_steps(self, steps: int) -> None:
        """Draw each imagined chunk's frame in ``steps`` denoising steps instead of the ``denoise_steps`` it was
        built with (fewer: faster imagination; more: closer to what was learnt)."""
        if self.denoiser is None:
            raise RiptError(f"denoise_steps={steps}: this world model regresses its frames (algo.model.output="
                            f"{self.regressed}); only the diffusion and warp_diffusion outputs denoise")
        self.denoiser.set_steps(int(steps))

    # ----------------------------------------------------------------- data in and out
    def set_task_embeddings(self, embeddings: torch.Tensor | None) -> None:
        if embeddings is not None:
            self.task_embeddings.copy_(embeddings)

    def fit_normalizers(self, obs: dict[str, torch.Tensor], actions: torch.Tensor) -> None:
        self.action_normalizer.fit(actions)
        if self.lowdim_keys:
            self.state_normalizer.fit(torch.cat([obs[k].float() for k in self.lowdim_keys], dim=-1))

    def task_index(self, name: str) -> int:
        if name not in self.task_names:
            raise RiptError(f"task {name!r} is not one this world model was trained on ({', '.join(self.task_names)})")
        return self.task_names.index(name)

    def encode_observation(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 images (B, H, W, 3) per camera and low-dim (B, d) per key -> (images (B, cameras*3, H, W) in
        [-1, 1], the normalised state (B, S)); a missing key or a wrong shape is a RiptError."""
        for k in self.image_keys:
            shape = tuple(obs[k].shape[1:]) if k in obs else None
            if shape != (self.image_size, self.image_size, 3):
                raise RiptError(f"world model: observation {k} has shape {shape}, expected "
                                f"({self.image_size}, {self.image_size}, 3) (the images it was trained on)")
        for k, d in self.lowdim_dims.items():
            shape = tuple(obs[k].shape[1:]) if k in obs else None
            if shape != (d,):
                raise RiptError(f"world model: observation {k} has shape {shape}, expected ({d},)")
        images = torch.cat([obs[k].permute(0, 3, 1, 2) for k in self.image_keys], dim=1).float() / 127.5 - 1.0
        return images, self.normalized_state(obs)

    def normalized_state(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        if not self.lowdim_keys:
            return torch.zeros(len(next(iter(obs.values()))), 0, device=self.action_normalizer.scale.device)
        return self.state_normalizer.normalize(torch.cat([obs[k].float() for k in self.lowdim_keys], dim=-1))

    def decode_observation(self, step: Imagined) -> dict[str, torch.Tensor]:
        """A prediction as the observation dict a policy reads: uint8 images (B, H, W, 3), float32 low-dim."""
        pixels = ((step.images.float() + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8)
        out = {k: pixels[:, 3 * i: 3 * i + 3].permute(0, 2, 3, 1).contiguous() for i, k in enumerate(self.image_keys)}
        if self.lowdim_keys:
            state = self.state_normalizer.unnormalize(step.state.float())
            for k, part in zip(self.lowdim_keys, state.split(list(self.lowdim_dims.values()), dim=-1)):
                out[k] = part.contiguous()
        return out

    # ----------------------------------------------------------------- one prediction
    def predict(self, images: torch.Tensor, state: torch.Tensor, task_ids: torch.Tensor, actions: torch.Tensor,
                noise: torch.Tensor | None = None) -> Imagined:
        """The observation after ``actions`` (B, chunk, A) from images in [-1, 1] and the normalised state
        (diffusion: drawn from the standard normal ``noise`` of shape (B, *noise_shape); None: torch's own)."""
        cond, inputs = self.conditioning(state, task_ids, actions)
        if self.unet is None:
            drawn, pooled = self.denoiser.sample([images], images, cond, noise)
            return self.heads(drawn, state, pooled, cond, inputs)
        out = self.regress(images, state, cond, inputs)
        if self.denoiser is not None:
            out.images = self.drawn_on(images, out.images, cond, noise)
        return out

    def drawn_on(self, images: torch.Tensor, regressed: torch.Tensor, cond: torch.Tensor,
                 noise: torch.Tensor | None) -> torch.Tensor:
        """warp_diffusion's frame: what the regressed frame lacks, drawn on it from ``noise``."""
        return self.denoiser.sample([images, regressed], regressed, cond, noise)[0]

    def regress(self, images: torch.Tensor, state: torch.Tensor, cond: torch.Tensor, inputs: torch.Tensor
                ) -> Imagined:
        maps, pooled = self.unet(images, cond)
        return self.heads(self.next_images(images, maps), state, pooled, cond, inputs)

    def conditioning(self, state: torch.Tensor, task_ids: torch.Tensor, actions: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """The vector every block is scaled and shifted by, and what it is made from: the normalised actions, the
        state and the task."""
        if actions.shape[1:] != (self.chunk, self.action_dim):
            raise RiptError(f"world model: actions of shape {tuple(actions.shape[1:])}, expected ({self.chunk}, "
                            f"{self.action_dim}): it steps {self.chunk} actions at a time")
        inputs = self.condition_inputs(state, task_ids, actions)
        return self.cond(inputs), inputs

    def condition_inputs(self, state: torch.Tensor, task_ids: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        task = self.task_proj(self.task_embeddings[task_ids]) if self.uses_language else self.task_table(task_ids)
        a = self.action_normalizer.normalize(actions.float()).flatten(1)
        return torch.cat([a.to(task.dtype), state.to(task.dtype), task], dim=-1)

    def state_steps_loss(self, obs: dict[str, torch.Tensor], next_obs: dict[str, torch.Tensor],
                         actions: torch.Tensor, task_ids: torch.Tensor) -> torch.Tensor:
        """The dynamics head's MSE on steps drawn apart from the frames' batch (low-dim observations before and
        after ``actions`` (B, chunk, A)): reading no frame, it can learn on many more of them per step."""
        if self.state_from != "dynamics":
            raise RiptError("world model: state steps train only a state_head=dynamics head")
        state = self.normalized_state(obs)
        inputs = self.condition_inputs(state, task_ids, actions).detach()
        predicted = state + self.state_head(inputs).to(state.dtype)
        return (predicted.float() - self.normalized_state(next_obs)).pow(2).mean()

    def heads(self, images: torch.Tensor, state: torch.Tensor, pooled: torch.Tensor, cond: torch.Tensor,
              inputs: torch.Tensor) -> Imagined:
        head_in = torch.cat([pooled, cond], dim=-1)
        # a dynamics head reads no frame and learns from the state's error alone (the frame's networks, the frame's)
        state_in = head_in if self.state_from == "bottleneck" else inputs.detach().to(pooled.dtype)
        return Imagined(images, state + self.state_head(state_in).to(state.dtype),
                        self.success_head(head_in).squeeze(-1), head_in)

    @property
    def noise_shape(self) -> tuple[int, int, int] | None:
        """The standard normal noise one imagined step draws per env (diffusion); None: the model draws none."""
        return None if self.denoiser is None else (3 * len(self.image_keys), self.image_size, self.image_size)

    def next_images(self, images: torch.Tensor, maps: torch.Tensor) -> torch.Tensor:
        """The predicted frame from the U-Net's output maps: the frame plus its change, or the frame resampled along
        the predicted flow plus a change (per camera: 2 flow channels, then 3 change channels)."""
        if self.regressed == "change":
            return (images + maps).clamp(-1.0, 1.0)
        per_camera = maps.unflatten(1, (len(self.image_keys), MAP_CHANNELS["warp"]))
        flow, change = per_camera[:, :, :2].flatten(1, 2), per_camera[:, :, 2:].flatten(1, 2)
        return (warp(images, flow.to(images.dtype)) + change).clamp(-1.0, 1.0)

    @torch.no_grad()
    def step(self, obs: dict[str, torch.Tensor], task_ids: torch.Tensor, actions: torch.Tensor,
             noise: torch.Tensor | None = None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One imagined step of a batch: (the next observations as a policy reads them, success probabilities).
        On a GPU the convolutions run in bf16 (the frame itself is added up in fp32). A diffusion model's frames
        come from ``noise`` (B, *noise_shape), standard normal (None: drawn from torch's global generator)."""
        images, state = self.encode_observation(obs)
        with torch.autocast("cuda", torch.bfloat16, enabled=images.is_cuda):
            out = self.predict(images, state, task_ids, actions, noise)
        return self.decode_observation(out), torch.sigmoid(out.success_logit.float())

    # ----------------------------------------------------------------- training
    def pixel_error(self, error: torch.Tensor, target: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
        """Per sample, the mean of a per-pixel ``error`` map, the pixels that changed from ``before`` to ``target``
        weighted ``1 + motion_weight`` (a weighted mean: the loss's scale stays that of the plain mean)."""
        if not self.motion_weight:
            return error.mean(dim=(1, 2, 3))
        moved = (target - before).abs().amax(dim=1, keepdim=True) > 2 * MOVED_LEVELS / 255  # images in [-1, 1]
        weight = 1.0 + self.motion_weight * moved.float()
        return (error * weight).mean(dim=(1, 2, 3)) / weight.mean(dim=(1, 2, 3))

    def loss(self, obs: dict[str, torch.Tensor], future_obs: dict[str, torch.Tensor], future_done: torch.Tensor,
             actions: torch.Tensor, task_ids: torch.Tensor, draws: dict[str, torch.Tensor] | None = None
             ) -> dict[str, torch.Tensor]:
        """The unrolled loss: obs (B, 1, ...) at t, the observations after each of R chunks (B, R, ...), whether each
        chunk finished the demo (B, R) and the R chunks' actions (B, R*chunk, A). Chunks after the demo's end
        teach nothing (masked). A regressing model starts each chunk from its own prediction of the last; a model
        that only draws, from the real frame (noised by up to ``cond_noise``). ``draws`` (``diffusion_draws``) is a
        denoiser's noise; its pixel term is EDM's denoising error (``denoise_mse``, beside the regression's ``l1``)."""
        images, state = self.encode_observation({k: v[:, 0] for k, v in obs.items()})
        rollout = future_done.shape[1]
        pixels = {name: torch.zeros((), device=images.device) for name in self.pixel_metrics}
        state_err = success = counted = torch.zeros((), device=images.device)
        live = torch.ones(len(images), dtype=torch.bool, device=images.device)
        real = images  # the real frame before each chunk, against which the pixels that moved are found
        for r in range(rollout):
            target_images, target_state = self.encode_observation({k: v[:, r] for k, v in future_obs.items()})
            chunk = actions[:, r * self.chunk:(r + 1) * self.chunk]
            drawn = None if draws is None else {k: v[:, r] for k, v in draws.items()}
            out, errors, cond = self.chunk_errors(images, state, task_ids, chunk, target_images, drawn)
            m = live.float()
            for name, error in errors.items():
                pixels[name] = pixels[name] + (self.pixel_error(error, target_images, real) * m).sum()
            real = target_images
            if self.lowdim_keys:
                state_err = state_err + ((out.state.float() - target_state).pow(2).mean(-1) * m).sum()
            done = future_done[:, r].float()
            weight = 1.0 + (self.success_weight - 1.0) * done
            success = success + (F.binary_cross_entropy_with_logits(out.success_logit.float(), done, weight=weight,
                                                                    reduction="none") * m).sum()
            counted = counted + m.sum()
            live = live & ~future_done[:, r]
            if self.unet is not None:  # fed back: the next chunk starts from the regressed (or drawn) prediction
                images, state = self.fed_back(images, cond, out, drawn), out.state.detach()
            else:
                images, state = target_images, target_state
        n = counted.clamp(min=1)
        pixels, state_err, success = {k: v / n for k, v in pixels.items()}, state_err / n, success / n
        return {"loss": sum(pixels.values()) + state_err + success, **pixels, "state_mse": state_err,
                "success_bce": success}

    @torch.no_grad()
    def fed_back(self, images: torch.Tensor, cond: torch.Tensor, out: Imagined,
                 drawn: dict[str, torch.Tensor] | None) -> torch.Tensor:
        """The frame the unroll's next chunk starts from: the regressed prediction, or (``feed_back=drawn``) the
        frame drawn on it from the draws' own sampling noise, as imagination draws it (``cond``: the chunk's)."""
        regressed = out.images.detach()
        if self.feed_back == "regressed":
            return regressed
        return self.drawn_on(images, regressed, cond, drawn["sample_noise"]).to(regressed.dtype)

    @property
    def pixel_metrics(self) -> tuple[str, ...]:
        """The pixel terms of the loss: the regression's L1, a denoiser's EDM error, or both."""
        return ("l1",) * (self.unet is not None) + ("denoise_mse",) * (self.denoiser is not None)

    def chunk_errors(self, images: torch.Tensor, state: torch.Tensor, task_ids: torch.Tensor, actions: torch.Tensor,
                     target: torch.Tensor, draws: dict[str, torch.Tensor] | None
                     ) -> tuple[Imagined, dict[str, torch.Tensor], torch.Tensor]:
        """One chunk in training: the heads' outputs (a regressing model's prediction among them), the per-pixel
        error maps of each pixel term and the chunk's conditioning vector. The denoiser learns the change from the
        regressed frame, which it does not move (detached); a model that only draws reads its heads off the
        denoiser at the drawn noise level."""
        cond, inputs = self.conditioning(state, task_ids, actions)
        if self.unet is None:
            error, pooled = self.denoiser.error([images], images, target, cond, draws)
            return self.heads(images, state, pooled, cond, inputs), {"denoise_mse": error}, cond  # images not read
        out = self.regress(images, state, cond, inputs)
        errors = {"l1": (out.images.float() - target).abs()}
        if self.denoiser is not None:
            regressed = out.images.detach()
            errors["denoise_mse"] = self.denoiser.error([images, regressed], regressed, target, cond, draws)[0]
        return out, errors, cond

    def diffusion_draws(self, batch: int, rollout: int, device: torch.device, generator: torch.Generator
                        ) -> dict[str, torch.Tensor] | None:
        """A denoiser's training noise for ``batch`` samples of ``rollout`` chunks, drawn from ``generator``;
        None for a model without one."""
        if self.denoiser is None:
            return None
        frame = (batch, rollout, *self.noise_shape)
        draws = self.denoiser.draws(frame, device, generator)
        if self.feed_back == "drawn":  # the noise the fed-back frames are drawn from
            draws["sample_noise"] = torch.randn(frame, device=device, generator=generator)
        return draws
