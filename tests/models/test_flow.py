"""The flow-matching policy's model and its denoising math on small synthetic tensors: the loss falls, the ODE is
deterministic, and the Flow-Noise and Flow-SDE log-probs equal a hand-computed Gaussian reference."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import norm

from ript.errors import RiptError
from ript.models.flow import FlowPolicyModel
from ript.models.flow_denoise import Denoising, denoise, score_chain, stochastic_steps

A, C = 3, 4  # action dims, chunk


def tiny_model(seed: int = 0, time_sampling: str = "beta") -> FlowPolicyModel:
    torch.manual_seed(seed)
    model = FlowPolicyModel(task_names=["a", "b"], image_keys=["cam"], lowdim_dims={"state": 5}, action_dim=A,
                            chunk_size=C, lang_dim=None, dim=32, prefix_layers=1, expert_layers=2, n_head=2,
                            dropout=0.0, encoder_width=8, num_kp=4, encoder_stages=1, time_sampling=time_sampling)
    with torch.no_grad():  # a model that is not the identity at init (adaLN-Zero starts there)
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def batch(n: int = 6, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"obs": {"cam": torch.randint(0, 255, (n, 1, 16, 16, 3), generator=g, dtype=torch.uint8),
                    "state": torch.randn(n, 1, 5, generator=g)},
            "task_ids": torch.randint(0, 2, (n,), generator=g), "actions": torch.randn(n, C, A, generator=g)}


def test_the_flow_matching_loss_falls_on_a_fixed_batch():
    model, b = tiny_model().train(), batch()
    g = torch.Generator().manual_seed(0)
    noise, tau = torch.randn(6, C, A, generator=g), model.draw_times(6, "cpu", g)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(60):
        loss = model.loss(b["obs"], b["task_ids"], b["actions"], noise, tau)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.2 * losses[0], losses[::10]
    masked = model.loss(b["obs"], b["task_ids"], b["actions"], noise, tau, torch.zeros(6, C, dtype=torch.bool))
    assert float(masked["mse"]) == 0.0  # steps past an episode's end teach nothing


def test_flow_times_follow_the_chosen_distribution():
    g = torch.Generator().manual_seed(0)
    beta = tiny_model().draw_times(20_000, "cpu", g)
    uniform = tiny_model(time_sampling="uniform").draw_times(20_000, "cpu", g)
    assert 0.001 <= float(beta.min()) and float(beta.max()) <= 1.0
    assert abs(float(beta.mean()) - (0.001 + 0.999 * 0.6)) < 0.01  # Beta(1.5, 1) has mean 0.6
    assert abs(float(uniform.mean()) - 0.5) < 0.01
    with pytest.raises(RiptError, match="time_sampling='logit'"):
        tiny_model(time_sampling="logit")


def _prefix_cache(model, b):
    prefix = model.encode(b["obs"], b["task_ids"])
    return prefix.features, prefix.cache


@torch.no_grad()
def test_the_ode_is_deterministic_and_ignores_step_noise():
    model, b = tiny_model(), batch(3)
    _, cache = _prefix_cache(model, b)
    settings = Denoising(steps=4, method="flow_sde")
    off = stochastic_steps(settings, 3, None, deterministic=True, device="cpu")
    noise = torch.randn(3, 5, C, A)
    other = noise.clone()
    other[:, 1:] = torch.randn(3, 4, C, A)  # only the initial noise is read
    chain, log_prob, _ = denoise(model, cache, noise, settings, off)
    again, _, _ = denoise(model, cache, other, settings, off)
    assert torch.equal(chain, again) and torch.equal(log_prob, torch.zeros_like(log_prob))
    x = noise[:, 0]
    for k in range(4):  # plain Euler steps x <- x - v / K from tau = 1
        v, _ = model.expert(x, torch.full((3,), 1 - k / 4), cache)
        x = x - v / 4
    assert torch.allclose(chain[:, -1], x, atol=1e-6)


@torch.no_grad()
def test_flow_noise_chain_log_prob_equals_a_hand_computed_gaussian_reference():
    model, b = tiny_model(), batch(2)
    _, cache = _prefix_cache(model, b)
    settings = Denoising(steps=3, method="flow_noise", noise_std_range=(0.08, 0.16))
    on = stochastic_steps(settings, 2, None, deterministic=False, device="cpu")
    noise = torch.randn(2, 4, C, A, generator=torch.Generator().manual_seed(3))
    chain, log_prob, _ = denoise(model, cache, noise, settings, on)
    reference = 0.0
    for k in range(3):
        tau = 1 - k / 3
        v, hidden = model.expert(chain[:, k], torch.full((2,), tau), cache)
        std = 0.08 + 0.08 * torch.sigmoid(model.noise_head(hidden))
        mean = chain[:, k] - v / 3
        assert bool(((std >= 0.08) & (std <= 0.16)).all())
        reference = reference + norm.logpdf(chain[:, k + 1].double().numpy(), mean.double().numpy(),
                                            std.double().numpy())
    assert torch.allclose(log_prob.double(), torch.from_numpy(reference), atol=1e-4)
    scored, entropy, _ = score_chain(model, cache, chain, on, settings, every_step=False)
    assert torch.equal(scored, log_prob)  # rescoring the recorded chain gives the recorded log-probs
    assert bool((entropy > 0.5 + 0.5 * math.log(2 * math.pi) + math.log(0.08) - 1e-6).all())


@torch.no_grad()
def test_flow_sde_step_log_prob_equals_a_hand_computed_gaussian_reference():
    model, b = tiny_model(), batch(2)
    _, cache = _prefix_cache(model, b)
    a, steps = 0.5, 4
    settings = Denoising(steps=steps, method="flow_sde", noise_level=a, sde_steps="one")
    picks = torch.tensor([0, 2])  # row 0 at tau = 1 (sigma's denominator takes the next time), row 1 at 0.5
    on = stochastic_steps(settings, 2, picks, deterministic=False, device="cpu")
    assert on.tolist() == [[True, False, False, False], [False, False, True, False]]
    noise = torch.randn(2, steps + 1, C, A, generator=torch.Generator().manual_seed(4))
    chain, log_prob, _ = denoise(model, cache, noise, settings, on)
    for row, k in enumerate(picks.tolist()):
        tau, dt = 1 - k / steps, 1 / steps
        sigma = a * math.sqrt(tau / (1 - (tau if tau < 1 else 1 - dt)))
        x = chain[row : row + 1, k]
        v, _ = model.expert(x, torch.tensor([tau]), [(kk[row : row + 1], vv[row : row + 1]) for kk, vv in cache])
        mean = x - dt * (v + sigma**2 / (2 * tau) * (x + (1 - tau) * v))  # the reverse SDE's Euler-Maruyama step
        reference = norm.logpdf(chain[row, k + 1].double().numpy(), mean[0].double().numpy(), sigma * math.sqrt(dt))
        assert torch.allclose(log_prob[row].double(), torch.from_numpy(reference), atol=1e-4)
    scored, _, _ = score_chain(model, cache, chain, on, settings, every_step=False)
    assert torch.equal(scored, log_prob)
    every, _, hidden = score_chain(model, cache, chain, on, settings, every_step=True)
    assert torch.allclose(every, log_prob, atol=1e-6) and hidden.shape == (2, C, 32)


def test_denoising_settings_are_checked():
    for kwargs, words in (({"steps": 0}, "denoise_steps=0"), ({"method": "flow_cps"}, "noise_method='flow_cps'"),
                          ({"sde_steps": "two"}, "sde_steps='two'"),
                          ({"steps": 4, "sde_first_steps": 5}, "sde_first_steps=5"),
                          ({"sde_first_steps": 0}, "sde_first_steps=0"),
                          ({"noise_std_range": (0.2, 0.1)}, "noise_std_range"), ({"noise_level": 0.0}, "noise_level")):
        with pytest.raises(RiptError, match=words.replace("[", r"\[")):
            Denoising(**kwargs)
