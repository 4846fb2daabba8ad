"""The next frame drawn by denoising its change rather than regressed (``algo.model.output=diffusion``): EDM's
preconditioning (Karras et al., 2022), which keeps the network's input and target at unit scale at every noise
level, the noise levels it is trained at, and the few-step schedule it samples along (DIAMOND's choice for world
models: 3 Euler steps). A regressed frame is the average of the frames the model thinks possible, so a thin moving
part (a robot arm) fades into the background; a drawn frame is one of them, sharp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# what is denoised is the frame's change over the chunk, scaled to EDM's sigma_data: untrained, or at high noise,
# the model then predicts the frame as it is (a denoised next frame has to learn to copy it first, and at 900 steps
# drew it worse than the still frame: MetaWorld, 64 px); a chunk's change has a std near 0.12 in [-1, 1] there
CHANGE_SCALE = 4.0
NOISE_FREQUENCIES = 8  # sinusoids per scalar (the noise level, the conditioning frame's noise) fed to the network
NOISE_FEATURES = 2 * 2 * NOISE_FREQUENCIES


@dataclass(frozen=True)
class EDM:
    steps: int = 3            # denoising steps per imagined chunk (one network call each)
    sigma_data: float = 0.5   # the spread of frames in [-1, 1]
    sigma_min: float = 2e-3
    sigma_max: float = 5.0
    rho: float = 7.0          # how the schedule crowds its steps towards low noise
    log_sigma_mean: float = -0.4  # training noise levels: log-normal (EDM's and DIAMOND's)
    log_sigma_std: float = 1.2

    def precondition(self, sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(c_skip, c_out, c_in) per sample, shaped (B, 1, 1, 1): the denoised frame is c_skip * noisy + c_out *
        network(c_in * noisy)."""
        sigma = sigma.float().view(-1, 1, 1, 1)
        total = sigma.square() + self.sigma_data ** 2
        return self.sigma_data ** 2 / total, sigma * self.sigma_data / total.sqrt(), total.rsqrt()

    def training_sigmas(self, shape: tuple[int, ...], device: torch.device, generator: torch.Generator
                        ) -> torch.Tensor:
        normal = torch.randn(shape, device=device, generator=generator)
        return (self.log_sigma_mean + self.log_sigma_std * normal).exp()

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
