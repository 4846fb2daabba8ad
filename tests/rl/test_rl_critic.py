"""PPO with a learned critic: GAE against a hand computation, the losses' clipping, the values and rewards the
runner records against a step-by-step oracle, the value loss on a fixed batch, and a PPO-GAE run on
MetaWorld with dense rewards that resumes exactly."""

import json

import pytest
import torch
from safetensors.torch import load_file

from ript.config import compose
from ript.envs.runner import EnvRunner, RunnerOptions
from ript.envs.worker_env import EpisodeSpec
from ript.errors import RiptError
from ript.model_loader import load_model
from ript.policies.build import make_policy, sampling_settings
from ript.rl.advantages import GAE, gae
from ript.rl.critic import CRITIC_FILE, ContextValueHead, value_loss
from ript.rl.learners import ChunkLearner
from ript.rl.objective import ppo_loss
from ript.rl.rollout import decision_rewards
from ript.rl.update import make_optimizer, ppo_update, update_batch
from ript.stages import rl
from ript.utils import distributed as ddist
from tests.helpers.cli import rl_overrides
from tests.helpers.rollouts import step_by_step


def test_gae_matches_a_hand_computed_reference():
    """Three episodes: one that succeeds (no bootstrap), one cut by the time limit (bootstrapped from the value
    of its last observation), one of a single decision; padded to a common length."""
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [0.2, 0.3, 0.0], [0.9, 0.0, 0.0]])
    adv, returns = gae(rewards, values, torch.tensor([0.0, 0.4, 0.0]), torch.tensor([3, 2, 1]), gamma=0.9, lam=0.8)
    # by hand: delta_t = r_t + 0.9 V_{t+1} - V_t, A_t = delta_t + 0.72 A_{t+1}
    a2 = 1 - 0.7
    a1 = 0.9 * 0.7 - 0.6 + 0.72 * a2
    a0 = 0.9 * 0.6 - 0.5 + 0.72 * a1
    b1 = 0.9 * 0.4 - 0.3
    b0 = 0.9 * 0.3 - 0.2 + 0.72 * b1
    want = torch.tensor([[a0, a1, a2], [b0, b1, 0.0], [1 - 0.9, 0.0, 0.0]])
    torch.testing.assert_close(adv, want)
    torch.testing.assert_close(returns, torch.where(want != 0, want + values, torch.zeros(3, 3)))

    # the same through the estimator, from recorded episodes (success ends an episode, else it was cut)
    cfg = compose("rl", ["checkpoint=x", "rl.advantage=gae", "rl.gamma=0.9", "rl.gae_lambda=0.8",
                         "rl.rollouts_per_group=1"])
    episodes = [{"task": "t", "episode": i, "success": ok, "decisions": [{"value": v} for v in vals[:n]]}
                for i, (ok, vals, n) in enumerate(zip((True, False, True), values, (3, 2, 1)))]
    episodes[1]["decisions"][-1]["bootstrap_value"] = torch.tensor(0.4)
    rewards = [decision_rewards(e, "sparse", 1.0) for e in episodes]
    targets = GAE(cfg.rl).targets([[e] for e in episodes], rewards)
    torch.testing.assert_close(targets.advantages, torch.tensor([a0, a1, a2, b0, b1, 0.1]))
    torch.testing.assert_close(targets.episode_returns, torch.tensor([1.0, 0.0, 1.0]))


def test_estimators_and_rewards_are_checked_in_the_config():
    compose("rl", ["checkpoint=x", "rl.advantage=gae", "rl.rollouts_per_group=1"])  # a critic needs no group
    with pytest.raises(RiptError, match="rollouts_per_group=1 needs to be >= 2"):
        compose("rl", ["checkpoint=x", "rl.advantage=rloo", "rl.rollouts_per_group=1"])
    with pytest.raises(RiptError, match="rl.reward='shaped'"):
        compose("rl", ["checkpoint=x", "rl.reward=shaped"])
    with pytest.raises(RiptError, match="rl.clip_ratio_c=0.5"):
        compose("rl", ["checkpoint=x", "rl.clip_ratio_c=0.5"])


def test_dual_clip_bounds_negative_advantages_and_value_clipping_takes_the_worse():
    old = torch.zeros(2, 1)
    new = torch.tensor([[2.0], [2.0]])  # ratio e^2 ~ 7.4
    loss, stats = ppo_loss(new, old, torch.tensor([-1.0, 1.0]), 0.2, 0.2)
    assert loss.item() == pytest.approx((7.389 - 1.2) / 2, abs=1e-3)
    loss, stats = ppo_loss(new, old, torch.tensor([-1.0, 1.0]), 0.2, 0.2, clip_ratio_c=3.0)
    assert loss.item() == pytest.approx((3.0 - 1.2) / 2, abs=1e-3) and stats["dual_clip_fraction"] == 0.5

    returns = torch.tensor([1.0, 1.0])
    loss, stats = value_loss(torch.tensor([0.9, 3.0]), torch.tensor([0.0, 2.0]), returns, 0.2, "mse", 1.0)
    # first: clipped to 0.2 (error 0.8) is worse than 0.9 (0.1); second: 3.0 (error 2) is worse than 2.2 (1.2)
    assert loss.item() == pytest.approx((0.5 * 0.8**2 + 0.5 * 2.0**2) / 2) and stats["value_clip_fraction"] == 1.0
    huber, _ = value_loss(torch.tensor([4.0]), torch.tensor([4.0]), torch.tensor([1.0]), None, "huber", 1.0)
    assert huber.item() == pytest.approx(3.0 - 0.5)


def critic_policy(stage1_run, greedy: bool):
    model, ckpt = load_model(stage1_run)
    settings = sampling_settings(ckpt["metadata"], {"greedy": greedy, "temperature": 2.0}, ckpt["cfg"])
    cfg = compose("rl", [f"checkpoint={stage1_run}", "rl.advantage=gae", "amp=false"])
    policy = make_policy(model, settings, "cpu", seed=0)
    learner = ChunkLearner(model, settings, prior_only=True, critic_cfg=cfg.rl.critic)
    torch.manual_seed(0)
    torch.nn.init.normal_(learner.critic.mlp[-1].weight, std=0.1)  # a fresh head predicts 0 everywhere
    learner.attach(policy)
    return model, ckpt, cfg, learner, policy


def test_recorded_values_rewards_and_bootstraps_match_a_step_by_step_oracle(stage1_run):
    """20-step episodes of 8-step chunks end mid-chunk: the runner renders the last frames before the time
    limit, so the critic's bootstrap value is that of the true last observation; each decision's value and
    the shaped reward summed over its chunk are the oracle's too (several envs per worker, two groups)."""

    model, ckpt, _, learner, policy = critic_policy(stage1_run, greedy=True)
    render = ckpt["metadata"]["env_args"]["render"]
    specs = [EpisodeSpec("button-press-v3", 3, 0), EpisodeSpec("drawer-close-v3", 3, 1),
             EpisodeSpec("button-press-v3", 4, 2)]
    runner = EnvRunner(RunnerOptions("metaworld", model.task_names, render, 20, 1, num_workers=2,
                                     envs_per_worker=2))
    try:
        episodes = sorted(runner.run(policy, specs=specs)["episodes"], key=lambda e: e["episode"])
    finally:
        runner.close()
    assert not any(e["success"] for e in episodes)  # all cut by the limit: every episode bootstraps
    for spec, got in zip(specs, episodes):
        want = step_by_step(policy, spec, render, 20)
        assert len(got["decisions"]) == len(want["decisions"]) == 3 and got["length"] == want["length"] == 20
        torch.testing.assert_close(torch.stack([d["value"] for d in got["decisions"]]),
                                   torch.stack([d["value"] for d in want["decisions"]]))
        torch.testing.assert_close(torch.tensor(got["chunk_rewards"]), torch.tensor(want["chunk_rewards"]))
        torch.testing.assert_close(got["decisions"][-1]["bootstrap_value"], want["decisions"][-1]["bootstrap_value"])
        assert got["decisions"][-1]["bootstrap_value"] != got["decisions"][-1]["value"]
        assert all(r > 0 for r in got["chunk_rewards"])  # MetaWorld's shaped reward


def test_recorded_values_equal_recomputed_ones_and_the_value_loss_falls_on_a_fixed_batch(stage1_run):
    _, ckpt, cfg, learner, policy = critic_policy(stage1_run, greedy=False)
    runner = EnvRunner(RunnerOptions("metaworld", ["drawer-close-v3", "button-press-v3"],
                                     ckpt["metadata"]["env_args"]["render"], 20, 1, num_workers=2))
    try:
        episodes = runner.run(policy, specs=[EpisodeSpec("drawer-close-v3", 5, 0), EpisodeSpec("button-press-v3", 5, 1)]
                              )["episodes"]
    finally:
        runner.close()
    cfg = compose("rl", [f"checkpoint={stage1_run}", "rl.advantage=gae", "rl.reward=dense", "rl.reward_scale=0.1",
                         "rl.rollouts_per_group=1", "rl.lr=1e-9", "rl.critic.lr=1e-4", "rl.epochs=4",
                         "rl.minibatches=1", "amp=false"])
    data, _ = update_batch(learner, [[e] for e in episodes], GAE(cfg.rl), cfg, "cpu", ddist.DistInfo())
    torch.testing.assert_close(data["old_values"], torch.stack([d["value"] for e in episodes for d in e["decisions"]]))
    with torch.no_grad():
        scored = learner.score(data, torch.arange(len(data["old_values"])))
    torch.testing.assert_close(scored.values, data["old_values"])
    torch.testing.assert_close(scored.log_probs, data["old_log_probs"], atol=1e-5, rtol=1e-5)
    assert scored.entropy.shape == data["old_values"].shape and (scored.entropy > 0).all()

    opt, sched = make_optimizer(learner, cfg, "cpu")
    losses = [ppo_update(learner, opt, sched, data, cfg, ddist.DistInfo(), it, "cpu")["value_loss"]
              for it in range(8)]
    # it falls by half in four updates and then settles near what this critic fits (measured: 0.040 -> 0.022)
    assert max(losses[1:]) < losses[0] and losses[-1] < 0.6 * losses[0], losses


def test_ppo_gae_iteration_on_metaworld_with_dense_rewards_and_exact_resume(stage1_run, tmp_path):
    from tests.helpers.cli import first_scalar

    gae_overrides = ["rl.advantage=gae", "rl.reward=dense", "rl.reward_scale=0.1", "rl.critic.lr=1e-3",
                     "rl.clip_ratio_c=3.0", "rl.entropy_coef=0.01", "rl.normalize_advantages=true"]
    full = tmp_path / "full"
    rl.run(compose("rl", rl_overrides(stage1_run, full, 2) + gae_overrides))
    assert (full / "checkpoints" / "last" / CRITIC_FILE).is_file()
    for tag in ("critic/value_loss", "critic/explained_variance", "actor/entropy", "actor/policy_loss",
                "rollout/returns_mean"):
        first_scalar(full, tag)  # logged under RLinf's names
    part = tmp_path / "part"
    rl.run(compose("rl", rl_overrides(stage1_run, part, 1) + gae_overrides))
    rl.run(compose("rl", rl_overrides(stage1_run, part, 2) + gae_overrides + ["resume=true"]))
    for name in ("model.safetensors", CRITIC_FILE):
        a = load_file(str(full / "checkpoints" / "last" / name))
        b = load_file(str(part / "checkpoints" / "last" / name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    assert json.loads((full / "rl_history.json").read_text()) == json.loads((part / "rl_history.json").read_text())

    # an env-step budget ends a run after the iteration that reaches it
    plain = tmp_path / "plain"
    rl.run(compose("rl", rl_overrides(stage1_run, plain, 3) + ["rl.max_env_steps=1"]))
    assert json.loads((plain / "checkpoints" / "last" / "config.json").read_text())["step"] == 1
    # a critic-free run's checkpoint cannot be resumed as a PPO-GAE run: one line naming the missing file
    with pytest.raises(RiptError, match=f"{CRITIC_FILE}: missing"):
        rl.run(compose("rl", rl_overrides(stage1_run, plain, 3) + gae_overrides +
                       ["resume=true", "resume_allow_changes=[rl.advantage,rl.reward,rl.reward_scale,rl.critic.lr,"
                        "rl.clip_ratio_c,rl.entropy_coef,rl.normalize_advantages,rl.max_env_steps]"]))


def test_a_fresh_value_head_predicts_zero_and_detaches_its_input_on_request():
    head = ContextValueHead(dim=16, hidden=8)
    assert torch.equal(head(torch.randn(3, 5, 16)), torch.zeros(3))
    for detach in (True, False):
        head = ContextValueHead(dim=16, hidden=8, detach_input=detach)
        torch.nn.init.normal_(head.mlp[-1].weight)
        context = torch.randn(3, 5, 16, requires_grad=True)
        head(context).sum().backward()
        # detached: the value loss trains the head only; else its gradient reaches the policy's encoders too
        assert (context.grad is None) == detach and (detach or context.grad.abs().sum() > 0)
