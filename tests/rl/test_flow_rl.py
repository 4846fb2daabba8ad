"""RL of the flow policy on MetaWorld: recorded log-probs and values equal what the update recomputes, one PPO
iteration with each noise method resumes exactly, and its checkpoints evaluate through ``ript eval``."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from ript.config import compose
from ript.envs.runner import EnvRunner, RunnerOptions
from ript.envs.worker_env import EpisodeSpec
from ript.model_loader import load_model
from ript.models.flow_denoise import Denoising
from ript.policies.flow_policy import FlowPolicy
from ript.rl.flow_learner import FlowLearner
from ript.stages import rl
from tests.helpers.cli import assert_one_line_error, flow_rl_overrides, ript_here

CRITIC = OmegaConf.create({"hidden": 16, "detach_input": True})


def two_recorded_episodes(policy: FlowPolicy, model, ckpt, steps: int, seed: int) -> list[dict]:
    """The decisions of one button-press and one drawer-close episode of ``steps`` steps, planned together."""
    runner = EnvRunner(RunnerOptions("metaworld", model.task_names, ckpt["metadata"]["env_args"]["render"], steps, 1,
                                     num_workers=1, envs_per_worker=2))
    try:
        out = runner.run(policy, specs=[EpisodeSpec("button-press-v3", seed, 0),
                                        EpisodeSpec("drawer-close-v3", seed, 1)])
    finally:
        runner.close()
    return [d for e in out["episodes"] for d in e["decisions"]]


@pytest.mark.parametrize("method, position, level, first", [("flow_noise", "expert", "element", None),
                                                            ("flow_sde", "vlm", "chunk", None),
                                                            ("flow_sde", "expert", "element", 1)])
def test_recorded_log_probs_and_values_equal_the_recomputed_ones(flow_run, method, position, level, first):
    model, ckpt = load_model(flow_run)
    denoising = Denoising(steps=3, method=method, sde_first_steps=first)
    policy = FlowPolicy(model, denoising, 4, "cpu", seed=0, deterministic=False)
    learner = FlowLearner(model, denoising, 4, True, level, CRITIC, position)
    torch.nn.init.normal_(learner.critic.mlp[-1].weight)  # a fresh critic predicts 0 everywhere: not a test
    learner.attach(policy)
    decisions = two_recorded_episodes(policy, model, ckpt, 12, 8)
    assert len(decisions) == 2 * 3  # 12 steps, a new chunk every 4
    data = learner.collate(decisions, "cpu")
    with torch.no_grad():
        scored = learner.score(data, torch.arange(len(decisions)))
    values = torch.stack([d["value"] for d in decisions])
    assert values.std() > 0
    # all six in one batch: float32 rounding of another batch shape (measured: at most 7e-7)
    torch.testing.assert_close(scored.log_probs, data["old_log_probs"], atol=1e-5, rtol=0)
    torch.testing.assert_close(scored.values, values, atol=1e-5, rtol=0)
    for r in range(3):  # the two decisions planned together, rescored together: bit for bit
        together = torch.tensor([r, 3 + r])
        with torch.no_grad():
            again = learner.score(data, together)
        assert torch.equal(again.log_probs, data["old_log_probs"][together])
        assert torch.equal(again.values, values[together])
    assert data["old_log_probs"].shape == ((6, 4 * 4) if level == "element" else (6, 1))
    stochastic = data["stochastic"].sum(1)
    assert stochastic.tolist() == ([3] * 6 if method == "flow_noise" else [1] * 6)  # hybrid: one step per chunk
    if first is not None:  # the stochastic step is one of the first `first`
        assert not data["stochastic"][:, first:].any()


@pytest.mark.parametrize("extra", [
    ("policy.noise_method=flow_noise", "rl.advantage=gae", "policy.critic_position=expert", "rl.entropy_coef=0.01"),
    ("policy.noise_method=flow_sde", "rl.advantage=gae", "policy.critic_position=vlm", "policy.denoise_steps=2",
     "rl.flow_matching_coef=1.0", "rl.loss_aggregation=episodes", "rl.demo_coef=1.0", "rl.demo_batch=8"),
], ids=["flow_noise-gae-expert", "flow_sde-gae-vlm-flow_matching-episodes-demos"])
def test_an_rl_iteration_with_each_noise_method_resumes_exactly(flow_run, tmp_path, extra):
    full, part = tmp_path / "full", tmp_path / "part"
    rl.run(compose("rl", flow_rl_overrides(flow_run, full, 2, *extra)))
    rl.run(compose("rl", flow_rl_overrides(flow_run, part, 1, *extra)))
    rl.run(compose("rl", flow_rl_overrides(flow_run, part, 2, *extra, "resume=true")))
    for name in ("model.safetensors", "critic.safetensors"):
        a = load_file(str(full / "checkpoints" / "last" / name))
        b = load_file(str(part / "checkpoints" / "last" / name))
        assert all(torch.equal(a[k], b[k]) for k in a), name
    trained, _ = load_model(full, expect_stage="rl")
    base, _ = load_model(flow_run)
    assert not torch.equal(trained.velocity_out.weight, base.velocity_out.weight)  # the action expert learnt
    assert torch.equal(trained.prefix_pos, base.prefix_pos)  # the prefix and encoders stay imitation's
    assert torch.equal(trained.image_encoders["corner_rgb"].proj.weight, base.image_encoders["corner_rgb"].proj.weight)
    if "policy.noise_method=flow_noise" in extra:
        assert not torch.equal(trained.noise_head.weight, base.noise_head.weight)  # the entropy bonus reaches it
    history = json.loads((full / "rl_history.json").read_text())
    assert history == json.loads((part / "rl_history.json").read_text())
    # each update moved the ODE chunk evaluation executes, measured beside the sampled actions' approx KL
    assert all(e["update"]["eval_action_shift"] > 0 and e["update"]["approx_kl"] >= 0 for e in history)
    # the demo term, where on, was added at every optimiser step
    assert all((e["update"].get("demo_loss", 0) > 0) == ("rl.demo_coef=1.0" in extra) for e in history)


def test_an_evaluated_chunk_is_the_same_whichever_envs_share_its_batch(flow_run, tiny_data):
    """Evaluation plans whichever envs have answered, and a flow policy's continuous actions carry any change of
    the last bits into its episode: env 1's ODE chunk is identical planned alone, with envs 0 and 3, or with all
    four (on a CPU a batch of one row alone moves them)."""
    import h5py
    import numpy as np

    model, _ = load_model(flow_run)
    demo = sorted(tiny_data.rglob("*.hdf5"))[0]
    with h5py.File(demo, "r") as f:
        obs = f["data"][sorted(f["data"])[0]]["obs"]
        frames = [{k: obs[k][t] for k in model.image_keys + model.lowdim_keys} for t in range(4)]
    chunks = []
    for batch in ([1], [0, 1, 3], [0, 1, 2, 3]):
        policy = FlowPolicy(model, Denoising(steps=4, method="flow_sde", noise_level=0.5), 4, "cpu", seed=0)
        policy.reset(4)
        for i in range(4):
            policy.reset_env(i, model.task_names[i % len(model.task_names)], episode_key=i)
            policy.observe(i, frames[i])
        chunks.append(policy.act_chunk([i in batch for i in range(4)])[1])
    assert all(np.array_equal(chunk, chunks[0]) for chunk in chunks[1:])


def test_evaluation_actions_are_the_chunk_the_ode_runs_from_the_recorded_noise(flow_run):
    """With almost no SDE noise the sampled chain is the ODE's: the learner's evaluation actions, rebuilt from each
    chain's initial noise and the recorded prefix, are the chunks the rollout executed (normalised)."""
    model, ckpt = load_model(flow_run)
    denoising = Denoising(steps=4, method="flow_sde", noise_level=1e-6)
    policy = FlowPolicy(model, denoising, 4, "cpu", seed=0, deterministic=False)
    learner = FlowLearner(model, denoising, 4, True, "element")
    learner.attach(policy)
    data = learner.collate(two_recorded_episodes(policy, model, ckpt, 8, 3), "cpu")
    with torch.no_grad():
        actions = learner.evaluation_actions(data, torch.arange(len(data["chain"])))
    executed = data["chain"][:, -1, :4, : policy.action_dim].flatten(1)
    assert actions.shape == executed.shape == (4, 4 * policy.action_dim)
    torch.testing.assert_close(actions, executed.float(), atol=1e-4, rtol=0)


def test_advantage_weighted_flow_matching_pulls_the_ode_toward_the_chunks_that_did_well(flow_run, tmp_path):
    """Chunks sampled with much SDE noise lie away from the ODE's; minimising their flow-matching loss (from each
    chain's own noise) brings the chunk the ODE integrates from that noise toward them. In the PPO loss the term
    counts only decisions with a positive advantage, in proportion to it."""
    from ript.rl.update import micro_batch_loss

    model, ckpt = load_model(flow_run)
    denoising = Denoising(steps=3, method="flow_sde", noise_level=1.0)
    policy = FlowPolicy(model, denoising, 4, "cpu", seed=0, deterministic=False)
    learner = FlowLearner(model, denoising, 4, True, "element", regression=True)
    learner.attach(policy)
    data = learner.collate(two_recorded_episodes(policy, model, ckpt, 12, 5), "cpu")
    idx = torch.arange(len(data["chain"]))
    executed = data["chain"][:, -1, :4, : policy.action_dim].flatten(1).float()

    def ode_gap() -> float:
        with torch.no_grad():
            return float((learner.evaluation_actions(data, idx) - executed).pow(2).mean())

    cfg = compose("rl", flow_rl_overrides(flow_run, tmp_path / "r", 1, "rl.flow_matching_coef=2.0"))
    losses = {}
    for name, advantages in (("none", [-1.0, 0.0, -0.5] * 2), ("some", [1.0, 0.0, -0.5, 0.5, -1.0, 0.0])):
        data["advantages"] = torch.tensor(advantages)
        with torch.no_grad():
            losses[name] = micro_batch_loss(learner, data, idx, cfg, "cpu", None, None)
        errors = learner.chunk_regression(data, idx).detach()
    assert "flow_matching_loss" in losses["some"][1] and float(losses["none"][1]["flow_matching_loss"]) == 0
    # PPO's term at ratio 1 is -mean(A): the two batches' means are 0 and -0.5
    expected = -0.5 + 2.0 * float((errors * torch.tensor([1.0, 0, 0, 0.5, 0, 0])).mean())
    assert abs(float(losses["some"][0] - losses["none"][0]) - expected) < 1e-4
    gap, first = ode_gap(), float(errors.mean())
    opt = torch.optim.Adam(learner.params, lr=1e-3)
    for _ in range(30):
        opt.zero_grad()
        learner.chunk_regression(data, idx).mean().backward()
        opt.step()
    with torch.no_grad():
        assert float(learner.chunk_regression(data, idx).mean()) < 0.5 * first
    assert ode_gap() < 0.5 * gap


def test_flow_checkpoints_evaluate_through_the_cli_and_token_settings_are_refused(flow_run, tmp_path):
    code, _, err = ript_here("eval", f"checkpoint={flow_run}", "episodes_per_task=1", "num_workers=1",
                             "max_episode_steps=8", f"out_dir={tmp_path / 'eval'}", "n_videos=0")
    assert code == 0, err  # the checkpoint names its family: no policy= needed
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["sampling"] == {"action_horizon": 4, "denoise_steps": 4, "ode": True} and results["episodes"]
    assert_one_line_error(ript_here("eval", f"checkpoint={flow_run}", "sampling.temperature=2.0",
                               f"out_dir={tmp_path / 'e2'}"), "sampling.temperature=2.0", "samples no tokens")
    assert_one_line_error(ript_here("rl", f"checkpoint={flow_run}", "policy=skill_prior", f"run_dir={tmp_path / 'r'}"),
                          "flow policy family", "policy=flow")
    assert_one_line_error(ript_here("rl", f"checkpoint={flow_run}", "policy.noise_method=flow_cps",
                               f"run_dir={tmp_path / 'r'}"), "noise_method='flow_cps'")
    assert not (tmp_path / "r").exists()


def test_the_update_stops_early_at_its_kl_or_evaluation_shift_target(flow_run, tmp_path):
    """2 epochs x 2 minibatches are 4 optimiser steps; a tiny evaluation-shift target ends the update after its
    first (that step moved the ODE chunk), a tiny approx-KL target by its second (the first moved the policy the
    second minibatch is scored under)."""
    steps = {}
    for tag, extra in (("plain", ()), ("shift", ("rl.target_eval_shift=1e-9",)), ("kl", ("rl.target_kl=1e-12",))):
        # the probe runs in the update's micro-batches of 16 (up to 24 decisions here)
        # GAE on dense rewards: every group is kept and moves the policy, whatever its episodes' outcomes
        rl.run(compose("rl", flow_rl_overrides(flow_run, tmp_path / tag, 1, "rl.micro_batch=16",
                                               "rl.max_sampling_rounds=3", "rl.advantage=gae", *extra)))
        (entry,) = json.loads((tmp_path / tag / "rl_history.json").read_text())
        steps[tag] = entry["update"]["optimizer_steps"]
    assert steps["plain"] == 4 and steps["shift"] == 1 and 1 <= steps["kl"] <= 2
    assert_one_line_error(ript_here("rl", f"checkpoint={flow_run}", "rl.target_kl=0", f"run_dir={tmp_path / 'r'}"),
                          "rl.target_kl")


def test_rl_that_scores_only_the_first_steps_is_warned_about(capsys):
    from ript.policies.flow_family import warn_unscored_steps
    from ript.utils.logging import setup_console_logging

    setup_console_logging()
    said = []
    for settings in (Denoising(steps=4, sde_first_steps=1), Denoising(steps=4, sde_first_steps=4), Denoising(steps=4),
                     Denoising(steps=4, method="flow_noise", sde_first_steps=1)):
        warn_unscored_steps(settings)
        said.append("never scores the steps after the first" in capsys.readouterr().err)
    assert said == [True, False, False, False]  # only a one-step chain drawn from fewer than all K steps


def test_the_demo_term_draws_the_checkpoints_own_demos_per_step_and_its_loss_falls(flow_run, tmp_path):
    """RL's demo term (rl.demo_coef) rebuilds the flow run's training split from the checkpoint's metadata, draws
    a batch per (iteration, optimiser step) (so a resumed run draws the same), and training on it lowers it."""
    from ript.rl.demo_anchor import DemoAnchor

    model, ckpt = load_model(flow_run)
    cfg = compose("rl", flow_rl_overrides(flow_run, tmp_path / "r", 1, "rl.demo_coef=1.0", "rl.demo_batch=16"))
    anchor = DemoAnchor(model, ckpt["metadata"], cfg, "cpu")
    recorded = ckpt["metadata"]
    assert anchor.data.num_demos == recorded["num_demos"] and len(anchor.data) == recorded["num_samples"]
    model.eval()
    with torch.no_grad():
        first, again, other = anchor.loss(3, 0), anchor.loss(3, 0), anchor.loss(3, 1)
    assert torch.equal(first, again) and not torch.equal(first, other)
    learner = FlowLearner(model, Denoising(steps=4), 4, True, "element", demos=True)
    opt = torch.optim.Adam(learner.params, lr=1e-3)
    before = float(sum(anchor.loss(9, s) for s in range(4)).detach())
    for step in range(40):
        opt.zero_grad()
        anchor.loss(0, step).backward()
        opt.step()
    with torch.no_grad():
        assert float(sum(anchor.loss(9, s) for s in range(4))) < 0.8 * before


def test_the_demo_term_is_refused_without_the_demos_or_their_reading(flow_run, tmp_path):
    from ript.errors import RiptError
    from ript.rl.demo_anchor import DemoAnchor

    model, ckpt = load_model(flow_run)
    cfg = compose("rl", flow_rl_overrides(flow_run, tmp_path / "r", 1, "rl.demo_coef=1.0"))
    unread = {k: v for k, v in ckpt["metadata"].items() if k != "reading"}
    with pytest.raises(RiptError, match="does not record how its demos"):
        DemoAnchor(model, unread, cfg, "cpu")
    gone = {**ckpt["metadata"], "files": [*ckpt["metadata"]["files"], str(tmp_path / "gone.hdf5")]}
    with pytest.raises(RiptError, match="gone.hdf5"):
        DemoAnchor(model, gone, cfg, "cpu")
    learner = FlowLearner(model, Denoising(steps=4), 4, True, "element")  # π0's folder: no demos of its own
    from ript.rl.demo_anchor import demo_anchor
    with pytest.raises(RiptError, match="not trained here on demos"):
        demo_anchor(learner, ckpt["metadata"], cfg, "cpu", sharded=False)
    assert demo_anchor(learner, ckpt["metadata"], compose("rl", flow_rl_overrides(flow_run, tmp_path / "r", 1)),
                       "cpu", sharded=False) is None
    assert_one_line_error(ript_here("rl", f"checkpoint={flow_run}", "policy=flow", "rl.demo_coef=-1",
                                    f"run_dir={tmp_path / 'r2'}"), "demo_coef")
