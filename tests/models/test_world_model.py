"""The world model on small synthetic tensors: its loss falls on a fixed batch (regressing or denoising), chunks
after a demo's end teach nothing, the pixels that moved weigh as set, a step returns what a policy reads (a
denoising one's the same for the same noise), EDM's preconditioning and schedule are the formulas', and
observations or actions of the wrong shape are one line."""

from __future__ import annotations

import pytest
import torch

from ript.errors import RiptError
from ript.models.world_model import WorldModel, warp
from ript.models.world_model_diffusion import EDM

KEYS = ["corner_rgb", "gripperPOV_rgb"]


def tiny_model(chunk: int = 2, output: str = "change", state_head: str = "bottleneck",
               feed_back: str = "regressed") -> WorldModel:
    torch.manual_seed(0)
    model = WorldModel(["a", "b"], KEYS, {"robot_states": 5}, 16, 4, chunk, lang_dim=None, width=8, stages=2,
                       cond_dim=16, output=output, state_head=state_head, feed_back=feed_back)
    return model


def synthetic_batch(batch: int = 8, rollout: int = 2, chunk: int = 2):
    """Frames whose next image is the current one shifted right by the first action's sign: learnable."""
    g = torch.Generator().manual_seed(1)
    obs = {k: torch.randint(0, 256, (batch, 1, 16, 16, 3), generator=g, dtype=torch.uint8) for k in KEYS}
    obs["robot_states"] = torch.randn(batch, 1, 5, generator=g)
    actions = torch.randn(batch, rollout * chunk, 4, generator=g)
    future = {k: torch.stack([torch.roll(obs[k][:, 0], r + 1, dims=2) for r in range(rollout)], 1) for k in KEYS}
    future["robot_states"] = obs["robot_states"] + actions[:, chunk - 1::chunk, :1].cumsum(1)
    done = torch.zeros(batch, rollout, dtype=torch.bool)
    done[0, 0] = True
    return obs, future, done, actions, torch.arange(batch) % 2


@pytest.mark.parametrize("output,state_head,feed_back", [
    ("change", "bottleneck", "regressed"), ("warp", "bottleneck", "regressed"),
    ("diffusion", "bottleneck", "regressed"), ("warp_diffusion", "bottleneck", "regressed"),
    ("warp", "dynamics", "regressed"), ("diffusion", "dynamics", "regressed"),
    ("warp_diffusion", "bottleneck", "drawn")])
def test_the_loss_falls_on_a_fixed_batch(output, state_head, feed_back):
    model = tiny_model(output=output, state_head=state_head, feed_back=feed_back)
    obs, future, done, actions, task_ids = synthetic_batch()
    model.fit_normalizers({"robot_states": obs["robot_states"][:, 0]}, actions)
    draws = model.diffusion_draws(8, 2, torch.device("cpu"), torch.Generator().manual_seed(2))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    first = None
    for _ in range(60):
        out = model.loss(obs, future, done, actions, task_ids, draws)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        first = first if first is not None else {k: float(v.detach()) for k, v in out.items()}
    last = {k: float(v.detach()) for k, v in model.loss(obs, future, done, actions, task_ids, draws).items()}
    assert last["loss"] < 0.6 * first["loss"], (first, last)
    for name in (*model.pixel_metrics, "state_mse", "success_bce"):
        assert last[name] < first[name], name


def test_chunks_after_a_demos_end_teach_nothing():
    model = tiny_model()
    obs, future, done, actions, task_ids = synthetic_batch(batch=2)
    done[:] = False
    done[:, 0] = True  # both demos end in their first chunk: the second chunk's targets are past the end
    base = model.loss(obs, future, done, actions, task_ids)
    future = {k: v.clone() for k, v in future.items()}
    future["corner_rgb"][:, 1] = 0
    future["robot_states"][:, 1] += 100.0
    again = model.loss(obs, future, done, actions, task_ids)
    assert torch.equal(base["loss"], again["loss"])


def test_the_motion_weight_counts_the_pixels_that_moved_more_in_a_weighted_mean():
    """One image of 2x2 pixels, 3 channels; between the frames only pixel (0, 0) changed (channel 0, by 1). An
    error of 1 on that pixel: plain L1 is 1/12; weighted 1 + 9 it is (10/12) / (13/4) = 10/39. The same error on a
    pixel that did not move counts less than in plain L1: (1/12) / (13/4) = 1/39."""
    before = torch.zeros(1, 3, 2, 2)
    target = before.clone()
    target[0, 0, 0, 0] = 1.0
    on_moved, on_still = target.clone(), target.clone()
    on_moved[0, 0, 0, 0] = 0.0
    on_still[0, 0, 1, 1] = 1.0
    plain, weighted = tiny_model(), tiny_model()
    weighted.motion_weight = 9.0
    def error(predicted):
        return (predicted - target).abs()

    assert plain.pixel_error(error(on_moved), target, before).item() == pytest.approx(1 / 12)
    assert weighted.pixel_error(error(on_moved), target, before).item() == pytest.approx(10 / 39)
    assert weighted.pixel_error(error(on_still), target, before).item() == pytest.approx(1 / 39)
    assert weighted.pixel_error(error(target), target, before).item() == 0.0


def test_a_step_returns_the_observation_a_policy_reads_and_wrong_shapes_are_one_line():
    model = tiny_model().eval()
    obs, _, _, actions, task_ids = synthetic_batch(batch=3)
    current = {k: v[:, 0] for k, v in obs.items()}
    nxt, prob = model.step(current, task_ids, actions[:, :2])
    assert {k: (v.shape, v.dtype) for k, v in nxt.items()} == {
        "corner_rgb": ((3, 16, 16, 3), torch.uint8), "gripperPOV_rgb": ((3, 16, 16, 3), torch.uint8),
        "robot_states": ((3, 5), torch.float32)}
    assert prob.shape == (3,) and bool(((prob > 0) & (prob < 1)).all())
    assert torch.equal(nxt["corner_rgb"], current["corner_rgb"])  # untrained: the output layer predicts no change
    with pytest.raises(RiptError, match=r"observation corner_rgb has shape \(32, 32, 3\), expected \(16, 16, 3\)"):
        model.step({**current, "corner_rgb": torch.zeros(3, 32, 32, 3, dtype=torch.uint8)}, task_ids, actions[:, :2])
    with pytest.raises(RiptError, match=r"observation robot_states has shape None"):
        model.step({k: v for k, v in current.items() if k != "robot_states"}, task_ids, actions[:, :2])
    with pytest.raises(RiptError, match=r"actions of shape \(3, 4\), expected \(2, 4\)"):
        model.step(current, task_ids, actions[:, :3])
    with pytest.raises(RiptError, match="task 'c' is not one this world model was trained on"):
        model.task_index("c")


def test_a_flow_of_one_pixel_moves_each_camera_by_one_pixel_and_none_leaves_it():
    images = torch.rand(2, 6, 8, 8) * 2 - 1
    assert torch.allclose(warp(images, torch.zeros(2, 4, 8, 8)), images, atol=1e-6)
    flow = torch.zeros(2, 4, 8, 8)
    flow[:, 0] = 2 / 8  # the first camera reads one pixel to the right (x), the second one pixel down (y)
    flow[:, 3] = 2 / 8
    moved = warp(images, flow)
    assert torch.allclose(moved[:, :3, :, :-1], images[:, :3, :, 1:], atol=1e-5)
    assert torch.allclose(moved[:, 3:, :-1], images[:, 3:, 1:], atol=1e-5)
    assert torch.allclose(moved[:, :3, :, -1], images[:, :3, :, -1], atol=1e-5)  # the border repeats


def test_an_untrained_warping_model_predicts_that_nothing_moves_and_an_unknown_output_is_one_line():
    model = tiny_model(output="warp")
    obs, _, _, actions, task_ids = synthetic_batch(batch=2)
    model.fit_normalizers({"robot_states": obs["robot_states"][:, 0]}, actions)
    now = {k: v[:, 0] for k, v in obs.items()}
    after, _ = model.step(now, task_ids, actions[:, :2])
    for k in KEYS:
        assert torch.equal(after[k], now[k])
    unknown = "algo.model.output='flow' is not one of change, warp, diffusion, warp_diffusion"
    with pytest.raises(RiptError, match=unknown):
        WorldModel(["a"], KEYS, {}, 16, 4, 2, lang_dim=None, width=8, stages=2, cond_dim=16, output="flow")


def test_edm_preconditioning_schedule_and_training_noise_are_the_formulas():
    """sigma = sigma_data = 0.5: c_skip = 0.25 / 0.5, c_out = 0.25 / sqrt(0.5), c_in = 1 / sqrt(0.5); three steps
    from sigma_max to sigma_min with Karras's rho = 7 spacing, then 0; training levels log-normal but for the
    terminal share, at sigma_max."""
    edm = EDM(steps=3)
    c_skip, c_out, c_in = edm.precondition(torch.tensor([0.5]))
    assert (c_skip.item(), c_out.item(), c_in.item()) == pytest.approx((0.5, 0.25 / 0.5 ** 0.5, 1 / 0.5 ** 0.5))
    middle = ((80.0 ** (1 / 7) + 2e-3 ** (1 / 7)) / 2) ** 7
    assert edm.schedule() == pytest.approx([80.0, middle, 2e-3, 0.0])
    assert EDM(steps=1).schedule() == [80.0, 0.0]
    # a network that outputs 0 denoises every noisy change to c_skip times it: from pure noise, nearly no change
    assert edm.precondition(torch.tensor([80.0]))[0].item() == pytest.approx(0.25 / 6400.25)
    sigmas = edm.training_sigmas((20000,), torch.device("cpu"), torch.Generator().manual_seed(0))
    terminal = sigmas == 80.0
    assert terminal.float().mean().item() == pytest.approx(0.1, abs=0.01)
    assert sigmas[~terminal].log().mean().item() == pytest.approx(-0.4, abs=0.03)
    assert sigmas[~terminal].log().std().item() == pytest.approx(1.2, abs=0.03)


@pytest.mark.parametrize("output", ["diffusion", "warp_diffusion"])
def test_a_denoising_step_is_the_same_for_the_same_noise_and_reads_as_a_policy_observation(output):
    model = tiny_model(output=output).eval()
    obs, _, _, actions, task_ids = synthetic_batch(batch=3)
    model.fit_normalizers({"robot_states": obs["robot_states"][:, 0]}, actions)
    current = {k: v[:, 0] for k, v in obs.items()}
    assert model.noise_shape == (6, 16, 16)
    noise = torch.randn(3, 6, 16, 16, generator=torch.Generator().manual_seed(0))
    first, prob = model.step(current, task_ids, actions[:, :2], noise)
    again, prob_again = model.step(current, task_ids, actions[:, :2], noise.clone())
    other, _ = model.step(current, task_ids, actions[:, :2], -noise)
    assert {k: (v.shape, v.dtype) for k, v in first.items()} == {
        "corner_rgb": ((3, 16, 16, 3), torch.uint8), "gripperPOV_rgb": ((3, 16, 16, 3), torch.uint8),
        "robot_states": ((3, 5), torch.float32)}
    assert all(torch.equal(first[k], again[k]) for k in first) and torch.equal(prob, prob_again)
    assert not torch.equal(first["corner_rgb"], other["corner_rgb"])
    assert tiny_model(output="warp").noise_shape is None


def test_what_is_drawn_on_the_regressed_frame_leaves_the_regression_alone():
    """warp_diffusion: with zero noise an untrained denoiser draws nothing, so the frame is the warping U-Net's (an
    untrained one's: the current frame); the denoiser's error does not train the regressing U-Net, and both terms
    are in the loss."""
    model = tiny_model(output="warp_diffusion").eval()
    assert model.pixel_metrics == ("l1", "denoise_mse")
    obs, future, done, actions, task_ids = synthetic_batch(batch=3)
    model.fit_normalizers({"robot_states": obs["robot_states"][:, 0]}, actions)
    current = {k: v[:, 0] for k, v in obs.items()}
    after, _ = model.step(current, task_ids, actions[:, :2], torch.zeros(3, *model.noise_shape))
    assert all(torch.equal(after[k], current[k]) for k in KEYS)
    draws = model.diffusion_draws(3, 2, torch.device("cpu"), torch.Generator().manual_seed(2))
    out = model.loss(obs, future, done, actions, task_ids, draws)
    assert out["loss"].item() == pytest.approx(sum(out[k].item() for k in ("l1", "denoise_mse", "state_mse",
                                                                           "success_bce")), rel=1e-5)
    out["denoise_mse"].backward()
    assert all(p.grad is None or not p.grad.any() for p in model.unet.parameters())
    assert any(p.grad is not None and p.grad.any() for p in model.denoiser.parameters())


@pytest.mark.parametrize("steps", [1, 2, 5])
def test_the_denoising_steps_are_chosen_at_sampling_time_and_a_regressing_model_refuses_them(steps):
    """set_denoise_steps: that many denoiser calls per imagined chunk, one regressing call (warp_diffusion) before
    them, and another frame from the same noise; a model that only regresses has no steps to set (one line)."""
    model = tiny_model(output="warp_diffusion").eval()
    obs, _, _, actions, task_ids = synthetic_batch(batch=2)
    model.fit_normalizers({"robot_states": obs["robot_states"][:, 0]}, actions)
    current = {k: v[:, 0] for k, v in obs.items()}
    noise = torch.randn(2, *model.noise_shape, generator=torch.Generator().manual_seed(0))
    for p in model.denoiser.parameters():  # an untrained denoiser's output layer is zero: it would draw nothing
        torch.nn.init.normal_(p, std=0.3, generator=torch.Generator().manual_seed(3))
    three, _ = model.step(current, task_ids, actions[:, :2], noise)
    calls = {"denoiser": 0, "regression": 0}
    model.denoiser.unet.register_forward_hook(lambda *_: calls.__setitem__("denoiser", calls["denoiser"] + 1))
    model.unet.register_forward_hook(lambda *_: calls.__setitem__("regression", calls["regression"] + 1))
    model.set_denoise_steps(steps)
    drawn, _ = model.step(current, task_ids, actions[:, :2], noise)
    assert model.sampling_steps == steps and calls == {"denoiser": steps, "regression": 1}
    assert not torch.equal(drawn["corner_rgb"], three["corner_rgb"])
    with pytest.raises(RiptError, match=r"denoise_steps=2: this world model regresses its frames"):
        tiny_model(output="warp").set_denoise_steps(2)


def test_a_dynamics_state_head_learns_from_the_states_error_alone_and_an_unknown_one_is_one_line():
    """The state's error reaches the U-Net and the conditioning network through a bottleneck head, and only the
    head's own weights through a dynamics head (which reads the state, the actions and the task, not the frame)."""
    obs, future, done, actions, task_ids = synthetic_batch(batch=4, rollout=1)
    for state_head, reaches_the_frames_networks in (("bottleneck", True), ("dynamics", False)):
        model = tiny_model(output="warp", state_head=state_head)
        model.fit_normalizers({"robot_states": obs["robot_states"][:, 0]}, actions)
        model.loss(obs, future, done, actions, task_ids)["state_mse"].backward()
        for part in (model.unet, model.cond):
            reached = any(p.grad is not None and p.grad.abs().sum() > 0 for p in part.parameters())
            assert reached == reaches_the_frames_networks, (state_head, part)
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.state_head.parameters())
    # imagined: the dynamics head's state follows the actions and the state, whatever the frame
    model = tiny_model(output="warp_diffusion", state_head="dynamics").eval()
    model.fit_normalizers({"robot_states": obs["robot_states"][:, 0]}, actions)
    current = {k: v[:, 0] for k, v in obs.items()}
    other_frame = {**current, "corner_rgb": 255 - current["corner_rgb"]}
    noise = torch.zeros(4, *model.noise_shape)
    state = model.step(current, task_ids, actions, noise)[0]["robot_states"]
    assert torch.equal(model.step(other_frame, task_ids, actions, noise)[0]["robot_states"], state)
    assert not torch.equal(model.step(current, task_ids, -actions, noise)[0]["robot_states"], state)
    # steps of the state alone: the dynamics head's error on them, refused for a bottleneck head
    steps = {"obs": {"robot_states": obs["robot_states"][:, 0]},
             "next_obs": {"robot_states": future["robot_states"][:, 0]}, "actions": actions, "task_ids": task_ids}
    assert float(model.state_steps_loss(**steps).detach()) > 0
    with pytest.raises(RiptError, match="state steps train only a state_head=dynamics head"):
        tiny_model().state_steps_loss(**steps)
    with pytest.raises(RiptError, match="algo.model.state_head='joints' is not one of bottleneck, dynamics"):
        tiny_model(state_head="joints")


def test_a_drawn_frame_fed_back_starts_the_unrolls_next_chunk_and_only_warp_diffusion_draws_one():
    """feed_back=drawn: the second chunk starts from the frame drawn on the regressed one (from the draws' own
    sampling noise, so the loss is repeatable); the first chunk's terms are the regressed feed-back's, the second's
    differ. Another output with it is a one-line error."""
    obs, future, done, actions, task_ids = synthetic_batch()
    losses = {}
    for feed_back in ("regressed", "drawn"):
        model = tiny_model(output="warp_diffusion", feed_back=feed_back)
        model.fit_normalizers({"robot_states": obs["robot_states"][:, 0]}, actions)
        draws = model.diffusion_draws(8, 2, torch.device("cpu"), torch.Generator().manual_seed(2))
        assert ("sample_noise" in draws) == (feed_back == "drawn")
        one = model.loss(obs, {k: v[:, :1] for k, v in future.items()}, done[:, :1], actions[:, :2], task_ids,
                         {k: v[:, :1] for k, v in draws.items()})
        with torch.no_grad():
            two = [model.loss(obs, future, done, actions, task_ids, draws)["l1"] for _ in range(2)]
        assert torch.equal(two[0], two[1])
        losses[feed_back] = (float(one["l1"]), float(two[0]))
    assert losses["regressed"][0] == losses["drawn"][0] and losses["regressed"][1] != losses["drawn"][1]
    with pytest.raises(RiptError, match=r"feed_back='drawn' with output='warp'") as e:
        tiny_model(output="warp", feed_back="drawn")
    assert "\n" not in str(e.value)
