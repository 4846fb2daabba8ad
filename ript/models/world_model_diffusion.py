"""The next frame drawn by denoising a change rather than regressed: EDM's preconditioning (Karras et al., 2022),
which keeps the network's input and target at unit scale at every noise level, the noise levels it is trained at,
and the few-step schedule it samples along (DIAMOND's choice for world models: 3 Euler steps). A regressed frame is
the average of the frames the model thinks possible, so a thin moving part (a robot arm) fades into the background;
a drawn frame is one of them, sharp.

What is drawn is a change from a base frame: the current frame (``algo.model.output=diffusion``), or the frame a
regressing, warping U-Net predicts (``warp_diffusion``: the regressed frame moves the arm but blurs it, so the
denoiser only draws what it lacks, as corrective diffusion does on top of a regressed mean).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import nn

from ript.models.conditioned_unet import ConditionedUNet

# what is denoised is the change from the base frame (for ``diffusion`` the current frame's change over the chunk),
# scaled to EDM's sigma_data: untrained, or at high noise, the model then predicts the base frame as it is (a
# denoised next frame has to learn to copy it first, and at 900 steps drew it worse than the still frame:
# MetaWorld, 64 px); a chunk's change has a std near 0.12 in [-1, 1] there
CHANGE_SCALE = 4.0
NOISE_FREQUENCIES = 8  # sinusoids per scalar (the noise level, the conditioning frame's noise) fed to the network
NOISE_FEATURES = 2 * 2 * NOISE_FREQUENCIES


@dataclass(frozen=True)
class EDM:
    steps: int = 3            # denoising steps per imagined chunk (one network call each)
    sigma_data: float = 0.5   # the spread of frames in [-1, 1]
    sigma_min: float = 2e-3
    # where sampling starts: EDM's 80, not DIAMOND's 5 for frames, because a moved arm's scaled change reaches 8,
    # and at 5 a blob of it still shows through the noise: the model learns to read the change off its input there,
    # finds none in the pure noise it starts from, and draws nothing moving (MetaWorld pick-place: 72-85% of the
    # change's energy is in pixels above 2.5)
    sigma_max: float = 80.0
    rho: float = 7.0          # how the schedule crowds its steps towards low noise
    log_sigma_mean: float = -0.4  # training noise levels: log-normal (EDM's and DIAMOND's) ...
    log_sigma_std: float = 1.2
    terminal_share: float = 0.1  # ... and this share at sigma_max, where the first step, from pure noise, predicts
                                 # the change's mean given the actions (the log-normal reaches 80 once in 10^5)

    def precondition(self, sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(c_skip, c_out, c_in) per sample, shaped (B, 1, 1, 1): the denoised frame is c_skip * noisy + c_out *
        network(c_in * noisy)."""
        sigma = sigma.float().view(-1, 1, 1, 1)
        total = sigma.square() + self.sigma_data ** 2
        return self.sigma_data ** 2 / total, sigma * self.sigma_data / total.sqrt(), total.rsqrt()

    def training_sigmas(self, shape: tuple[int, ...], device: torch.device, generator: torch.Generator
                        ) -> torch.Tensor:
        normal = torch.randn(shape, device=device, generator=generator)
        terminal = torch.rand(shape, device=device, generator=generator) < self.terminal_share
        sigmas = (self.log_sigma_mean + self.log_sigma_std * normal).exp()
        return torch.where(terminal, torch.full_like(sigmas, self.sigma_max), sigmas)

    def schedule(self) -> list[float]:
        """``steps`` noise levels from sigma_max down to sigma_min (Karras's spacing), then 0."""
        if self.steps == 1:
            return [self.sigma_max, 0.0]
        low, high = self.sigma_min ** (1 / self.rho), self.sigma_max ** (1 / self.rho)
        return [(high + i / (self.steps - 1) * (low - high)) ** self.rho for i in range(self.steps)] + [0.0]


def noise_features(sigma: torch.Tensor, frame_noise: torch.Tensor) -> torch.Tensor:
    """Sinusoids of log(sigma)/4 (EDM's c_noise) and of the conditioning frame's noise level, (B, NOISE_FEATURES)."""
    scalars = torch.stack([sigma.float().log() / 4, frame_noise.float()], dim=-1)  # (B, 2)
    freqs = math.pi * 2.0 ** torch.arange(NOISE_FREQUENCIES, device=sigma.device)
    angles = (scalars[..., None] * freqs).flatten(1)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class ChangeDenoiser(nn.Module):
    """A U-Net that draws the next frame as ``base`` plus a change denoised along EDM's schedule, reading the
    ``context`` frames (the current frame first; then, for ``warp_diffusion``, the regressed next frame) beside the
    noisy change, FiLM-conditioned on the conditioning vector and the noise levels."""

    def __init__(self, channels: int, context: int, width: int, stages: int, cond_dim: int, steps: int,
                 cond_noise: float):
        super().__init__()
        self.edm, self.cond_noise = EDM(steps=steps), cond_noise
        self.unet = ConditionedUNet(channels * (context + 1), width, stages, cond_dim, channels)
        self.noise_embedding = nn.Sequential(nn.Linear(NOISE_FEATURES, cond_dim), nn.SiLU(),
                                             nn.Linear(cond_dim, cond_dim))

    def set_steps(self, steps: int) -> None:
        """Sample with ``steps`` network calls per chunk from now on (training does not depend on it)."""
        self.edm = replace(self.edm, steps=steps)

    def network(self, context: list[torch.Tensor], noisy: torch.Tensor, sigma: torch.Tensor, cond: torch.Tensor,
                frame_noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The raw output for a noisy change at noise level ``sigma`` (B,), and the pooled bottleneck; the current
        frame was noised by ``frame_noise`` (B,) (training only)."""
        _, _, c_in = self.edm.precondition(sigma)
        noise_cond = self.noise_embedding(noise_features(sigma, frame_noise)).to(cond.dtype)
        return self.unet(torch.cat([*context, (c_in * noisy).to(context[0].dtype)], dim=1), cond + noise_cond)

    def sample(self, context: list[torch.Tensor], base: torch.Tensor, cond: torch.Tensor,
               noise: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The change drawn with Euler steps from standard normal ``noise`` (None: torch's own; no noise is added
        after it: the last step lands on the denoised change), the frame it makes on ``base``, and the pooled
        bottleneck of the last, least noisy, call."""
        sigmas = self.edm.schedule()
        x = (torch.randn_like(base, dtype=torch.float32) if noise is None else noise.float()) * sigmas[0]
        clean = torch.zeros(len(base), device=base.device)
        for now, after in zip(sigmas[:-1], sigmas[1:]):
            sigma = torch.full((len(base),), now, device=base.device)
            raw, pooled = self.network(context, x, sigma, cond, clean)
            c_skip, c_out, _ = self.edm.precondition(sigma)
            denoised = c_skip * x + c_out * raw.float()
            x = denoised if after == 0 else x + (x - denoised) / now * (after - now)
        return (base + x / CHANGE_SCALE).clamp(-1.0, 1.0), pooled

    def error(self, context: list[torch.Tensor], base: torch.Tensor, target: torch.Tensor, cond: torch.Tensor,
              draws: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """EDM's training error, per pixel: the network's output against the one that denoises the change from
        ``base`` to ``target`` exactly, at the drawn noise level, the current frame (context's first) noised as
        drawn; and the pooled bottleneck."""
        sigma, frame_noise = draws["sigma"], draws["frame_noise_level"]
        change = (target - base) * CHANGE_SCALE
        noisy = change + sigma.view(-1, 1, 1, 1) * draws["noise"]
        context = [context[0] + frame_noise.view(-1, 1, 1, 1) * draws["frame_noise"], *context[1:]]
        raw, pooled = self.network(context, noisy, sigma, cond, frame_noise)
        c_skip, c_out, _ = self.edm.precondition(sigma)
        return (raw.float() - (change - c_skip * noisy) / c_out).square(), pooled

    def draws(self, frame: tuple[int, ...], device: torch.device, generator: torch.Generator
              ) -> dict[str, torch.Tensor]:
        """The training noise of samples of ``frame``'s leading shape (batch, chunks): noise levels, the noise, the
        current frame's noise level (uniform up to ``cond_noise``) and its noise, drawn from ``generator``."""
        levels = frame[:2]
        level = torch.rand(levels, device=device, generator=generator) * self.cond_noise
        return {"sigma": self.edm.training_sigmas(levels, device, generator),
                "noise": torch.randn(frame, device=device, generator=generator),
                "frame_noise_level": level,
                "frame_noise": torch.randn(frame, device=device, generator=generator) if self.cond_noise
                else torch.zeros((*levels, 1, 1, 1), device=device)}
