"""Denoising a flow policy's action chunk in K Euler steps from τ = 1 (noise) to τ = 0, deterministic (the ODE)
or with a Gaussian at some steps, so that RL can score the chain (πRL):

- ``flow_noise``: every step is a Gaussian around the Euler step's mean with the noise head's learned standard
  deviation, bounded to ``noise_std_range``; the chunk's log-prob is the joint log-prob of the whole chain.
- ``flow_sde``: the ODE turned into the SDE with the same marginals, σ_τ = a·sqrt(τ / (1 − τ)) (a:
  ``noise_level``; at τ = 1 the next time's τ stands in the denominator): the step's mean
  ``x − Δ·[v + σ²/(2τ)·(x + (1 − τ)·v)]`` and standard deviation ``σ·sqrt(Δ)`` (Δ = τ_k − τ_{k+1}); with
  ``sde_steps=one`` one randomly chosen step per chunk is stochastic (the hybrid ODE–SDE sampling; with
  ``sde_first_steps=n`` one of the first n, whose noise the later ODE steps carry back towards the learnt
  actions), with ``all`` every step is.

Evaluation integrates the ODE. Every function here runs without host synchronisation (a CUDA graph can hold it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ript.errors import RiptError

NOISE_METHODS = ("flow_noise", "flow_sde")
SDE_STEPS = ("one", "all")


@dataclass(frozen=True)
class Denoising:
    steps: int = 4                               # K Euler steps
    method: str = "flow_sde"                     # how RL makes the chain stochastic (NOISE_METHODS)
    noise_level: float = 0.5                     # flow_sde: a in σ_τ = a·sqrt(τ / (1 − τ))
    noise_std_range: tuple[float, float] = (0.08, 0.16)  # flow_noise: the learned std's bounds
    sde_steps: str = "one"                       # flow_sde: one random stochastic step per chunk, or all
    sde_first_steps: int | None = None           # flow_sde, one: that step is one of the first n (None: of all K)

    def __post_init__(self):
        if self.steps < 1:
            raise RiptError(f"denoise_steps={self.steps} must be >= 1")
        if self.method not in NOISE_METHODS:
            raise RiptError(f"noise_method={self.method!r}; choose one of {', '.join(NOISE_METHODS)}")
        if self.sde_steps not in SDE_STEPS:
            raise RiptError(f"sde_steps={self.sde_steps!r}; choose one of {', '.join(SDE_STEPS)}")
        low, high = self.noise_std_range
        if not 0 < low <= high:
            raise RiptError(f"noise_std_range={list(self.noise_std_range)} must be 0 < low <= high")
        if self.noise_level <= 0:
            raise RiptError(f"noise_level={self.noise_level} must be > 0")
        if self.sde_first_steps is not None and not 1 <= self.sde_first_steps <= self.steps:
            raise RiptError(f"sde_first_steps={self.sde_first_steps} must be between 1 and denoise_steps={self.steps}")

    @property
    def picked_from(self) -> int:
        """Flow-SDE's one stochastic step is drawn from steps 0 .. picked_from - 1."""
        return self.steps if self.sde_first_steps is None else self.sde_first_steps

    @property
    def joint(self) -> bool:
        """Whether every step is scored (Flow-Noise, or Flow-SDE with ``sde_steps=all``)."""
        return self.method == "flow_noise" or self.sde_steps == "all"


def flow_times(steps: int, device) -> torch.Tensor:
    """τ_0 .. τ_K: 1, 1 − 1/K, ..., 0."""
    return torch.linspace(1.0, 0.0, steps + 1, device=device)


def sde_sigma(times: torch.Tensor, k: torch.Tensor, noise_level: float) -> torch.Tensor:
    """σ at step k (a tensor of step indices): a·sqrt(τ_k / (1 − τ_k)), with τ_1 in the denominator at τ_k = 1."""
    tau = times[k]
    denominator = 1 - torch.where(tau >= 1, times[1], tau)
    return noise_level * torch.sqrt(tau / denominator)


def step_gaussian(model, x: torch.Tensor, k: torch.Tensor, cache: list, settings: Denoising,
                  stochastic: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The distribution of step k's result for chunks x (B, C, A), each row at its own step index k (B,):
    (mean (B, C, A), std (B, C, A), the expert's hidden states (B, C, D)). Rows where ``stochastic`` (B,) is
    False take the ODE's Euler step with std 0."""
    times = flow_times(settings.steps, x.device)
    tau, delta = times[k], times[k] - times[k + 1]
    velocity, hidden = model.expert(x, tau, cache)
    v = velocity.float()
    xf = x.float()
    t, d = tau[:, None, None], delta[:, None, None]
    ode = xf - d * v  # the Euler step of the ODE: every step's mean but for Flow-SDE's correction
    mean = ode
    if settings.method == "flow_noise":
        std = model.noise_std(hidden, *settings.noise_std_range)
    else:
        sigma = sde_sigma(times, k, settings.noise_level)[:, None, None]
        mean = mean - d * sigma.pow(2) / (2 * t) * (xf + (1 - t) * v)
        std = (sigma * d.sqrt()).expand_as(mean)
    on = stochastic[:, None, None]
    return torch.where(on, mean, ode), torch.where(on, std, torch.zeros_like(std)), hidden


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Elementwise log N(x; mean, std²); 0 where std is 0 (a deterministic step)."""
    safe = torch.where(std > 0, std, torch.ones_like(std))
    lp = -0.5 * ((x - mean) / safe).pow(2) - safe.log() - 0.5 * math.log(2 * math.pi)
    return torch.where(std > 0, lp, torch.zeros_like(lp))


def gaussian_entropy(std: torch.Tensor) -> torch.Tensor:
    """Elementwise entropy of N(·, std²); 0 where std is 0."""
    safe = torch.where(std > 0, std, torch.ones_like(std))
    return torch.where(std > 0, 0.5 + 0.5 * math.log(2 * math.pi) + safe.log(), torch.zeros_like(std))


def stochastic_steps(settings: Denoising, batch: int, picks: torch.Tensor | None, deterministic: bool,
                     device) -> torch.Tensor:
    """(B, K) bools: which steps of each row's chain are stochastic. ``picks`` (B,): flow_sde's chosen step per
    row with ``sde_steps=one``."""
    k = settings.steps
    if deterministic:
        return torch.zeros(batch, k, dtype=torch.bool, device=device)
    if not settings.joint:
        return torch.arange(k, device=device)[None] == picks[:, None]
    return torch.ones(batch, k, dtype=torch.bool, device=device)


def denoise(model, cache: list, noise: torch.Tensor, settings: Denoising, stochastic: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Integrate from the initial noise ``noise[:, 0]`` (B, C, A), drawing step k's Gaussian with ``noise[:, k+1]``
    where ``stochastic[:, k]``: (chain (B, K+1, C, A) of normalised chunks, per-element log-probs of the stochastic
    steps summed (B, C, A), the expert's hidden states averaged over the steps (B, C, D))."""
    b, k_steps = noise.shape[0], settings.steps
    x = noise[:, 0].float()
    chain, log_prob, hidden_sum = [x], torch.zeros_like(x), None
    for k in range(k_steps):
        step = torch.full((b,), k, dtype=torch.long, device=x.device)
        mean, std, hidden = step_gaussian(model, x, step, cache, settings, stochastic[:, k])
        x = mean + std * noise[:, k + 1].float()
        log_prob = log_prob + gaussian_log_prob(x, mean, std)
        hidden_sum = hidden.float() if hidden_sum is None else hidden_sum + hidden.float()
        chain.append(x)
    return torch.stack(chain, 1), log_prob, hidden_sum / k_steps


def score_chain(model, cache: list, chain: torch.Tensor, stochastic: torch.Tensor, settings: Denoising,
                every_step: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A recorded chain (B, K+1, C, A) scored by the current parameters: (per-element log-probs of its stochastic
    steps summed (B, C, A), their mean entropy per element (B,), the expert's hidden states averaged over all K
    steps (B, C, D) when ``every_step``, else None). Without ``every_step``, a one-step chain (Flow-SDE's
    ``sde_steps=one``) runs the expert once, at each row's stochastic step."""
    b, k_steps = chain.shape[0], settings.steps
    rows = torch.arange(b, device=chain.device)
    if not every_step and not settings.joint:
        k = stochastic.long().argmax(1)
        mean, std, _ = step_gaussian(model, chain[rows, k], k, cache, settings, stochastic.any(1))
        return gaussian_log_prob(chain[rows, k + 1].float(), mean, std), gaussian_entropy(std).flatten(1).mean(1), None
    log_prob = torch.zeros_like(chain[:, 0], dtype=torch.float32)
    entropy = torch.zeros(b, device=chain.device)
    hidden_sum = None
    for k in range(k_steps):
        step = torch.full((b,), k, dtype=torch.long, device=chain.device)
        mean, std, hidden = step_gaussian(model, chain[:, k], step, cache, settings, stochastic[:, k])
        log_prob = log_prob + gaussian_log_prob(chain[:, k + 1].float(), mean, std)
        entropy = entropy + gaussian_entropy(std).flatten(1).mean(1)
        hidden_sum = hidden.float() if hidden_sum is None else hidden_sum + hidden.float()
    scored = stochastic.float().sum(1).clamp(min=1)
    return log_prob, entropy / scored, hidden_sum / k_steps
