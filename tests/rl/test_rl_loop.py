"""RL stage: estimators, objective, sampling and real iterations on MetaWorld (resume, torchrun); the runner's
rollouts against an oracle are in test_rl_rollouts.py."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from ript.config import compose
from ript.envs.runner import EnvRunner, RunnerOptions
from ript.envs.worker_env import EpisodeSpec
from ript.model_loader import load_model
from ript.policies.build import make_policy, sampling_settings
from ript.rl.advantages import grpo, rloo
from ript.rl.learners import ChunkLearner
from ript.rl.objective import decision_weights, ppo_loss, token_log_probs
from ript.rl.rollout import GroupSampling, InformativePrefix, collect_groups, group_episodes
from ript.rl.sampler import InitialConditionSampler
from ript.rl.update import ppo_update, rescore
from ript.stages import evaluate, rl
from ript.utils import distributed as ddist
from tests.helpers.cli import assert_one_line_error, ript_here, rl_overrides
from tests.helpers.faults import processes


def test_rloo_and_grpo():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    a = rloo(r)
    assert torch.allclose(a[0], torch.tensor([1 - 1 / 3, -2 / 3, -2 / 3, 1 - 1 / 3]))
    assert torch.equal(a[1], torch.zeros(4))
    g = grpo(r)
    assert torch.allclose(g[0], torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-4) and torch.equal(g[1], torch.zeros(4))


def test_ppo_loss_clips_both_sides():
    old = torch.zeros(2, 3)
    new = torch.tensor([[0.5, 0.5, 0.5], [-0.5, -0.5, -0.5]])
    loss, stats = ppo_loss(new, old, torch.tensor([1.0, -1.0]), clip_low=0.2, clip_high=0.1)
    # positive advantage: ratio capped at 1.1; negative advantage: ratio floored at 0.8
    assert abs(loss.item() - (-(1.1 * 1.0 + 0.8 * -1.0) / 2)) < 1e-6
    assert stats["clip_fraction"] == 1.0


def test_episode_aggregation_weighs_every_episode_the_same():
    """``rl.loss_aggregation=episodes``: a success in 2 decisions and a failure run to the time limit in 6 weigh
    the same in PPO's mean, and the weights average 1, as the decision mean's do."""
    weights = decision_weights([2, 6])
    assert torch.allclose(weights, torch.tensor([2.0, 2.0] + [2 / 3] * 6))
    assert torch.allclose(weights[:2].sum(), weights[2:].sum()) and abs(weights.mean().item() - 1) < 1e-6
    old, new = torch.zeros(8, 2), torch.randn(8, 2, generator=torch.Generator().manual_seed(0)) * 0.01
    advantages = torch.tensor([1.0, 1.0] + [-1.0] * 6)
    weighted, _ = ppo_loss(new, old, advantages, 0.2, 0.2, weights=weights)
    per_decision = -(torch.minimum(new.exp() * advantages[:, None],
                                   new.exp().clamp(0.8, 1.2) * advantages[:, None])).mean(1)
    # the two sides sum in different orders and nearly cancel, so the tolerance is absolute
    assert torch.allclose(weighted, (per_decision * weights).mean(), atol=1e-6)
    assert torch.allclose(ppo_loss(new, old, advantages, 0.2, 0.2)[0], per_decision.mean(), atol=1e-6)


def test_sampler_skips_mastered_and_round_trips_its_state():
    s = InitialConditionSampler(["a"], seed=0, pool_size=2, skip_mastered_for=3)
    first = s.draws().draw(0)
    s.record(first, [1.0, 1.0])
    assert all(s.draws().draw(g) != first for g in range(5))
    state = s.state_dict()
    again = InitialConditionSampler(["a"], seed=5, pool_size=2, skip_mastered_for=3)
    again.load_state_dict(state)
    assert [again.draws().draw(g) for g in range(4)] == [s.draws().draw(g) for g in range(4)]


def test_a_groups_draw_depends_on_its_number_and_iteration_only():
    """However many groups an iteration streams, and in whatever order they are asked for, group g is the same."""
    s = InitialConditionSampler([f"t{i}" for i in range(5)], seed=3)
    forward = [s.draws().draw(g) for g in range(20)]
    assert [s.draws().draw(g) for g in reversed(range(20))] == forward[::-1]
    assert len(set(forward)) > 10
    s.start_iteration(1)
    assert [s.draws().draw(g) for g in range(20)] != forward


def test_groups_stay_apart_when_two_draws_share_an_initial_condition():
    eps = [{"task": "a", "seed": 5, "episode": g * 2 + j, "success": bool(j)} for g in (1, 0) for j in (1, 0)]
    groups = group_episodes(eps, 2)
    assert [[e["episode"] for e in g] for g in groups] == [[0, 1], [2, 3]]
    # a group that lost a rollout to a failed env worker is left out whole; a mixed-up group is a bug
    assert [[e["episode"] for e in g] for g in group_episodes(eps[:3], 2)] == [[2, 3]]
    with pytest.raises(RuntimeError, match="malformed"):
        group_episodes([eps[0], {**eps[1], "seed": 6}], 2)


def test_informative_prefix_settles_on_the_first_groups_in_draw_order():
    """Groups 0..m count once all of them have ended and hold the needed informative ones, whatever order their
    episodes end in; a group that lost a rollout counts as uninformative."""
    rule = InformativePrefix(k=2, need=2)
    for _ in range(4):
        rule.add_group()
    ended = lambda g, j, success: rule.finished({"episode": g * 2 + j, "success": success})  # noqa: E731
    ended(1, 0, True), ended(1, 1, False), ended(3, 0, True), ended(3, 1, False)  # mixed, but group 0 is open
    assert not rule.satisfied() and rule.settled == 0
    ended(0, 0, True)
    rule.dropped(EpisodeSpec("a", 1, 1))  # group 0 lost a rollout
    assert not rule.satisfied() and (rule.settled, rule.informative) == (2, 1)
    ended(2, 1, False), ended(2, 0, True)
    assert rule.satisfied() and (rule.settled, rule.informative) == (3, 2)  # group 3 is not counted


def test_groups_drawn_per_round_and_iteration():
    sampler = InitialConditionSampler(["a", "b"], seed=0, k=8)
    auto = GroupSampling(k=8, groups=16, max_rounds=4, oversample=None)
    assert sampler.informative_share() == pytest.approx(1 - 2 * 0.5**8)  # nothing seen: p = 0.5
    assert auto.round_groups(16, sampler, env_slots=64) == 17 and auto.round_groups(0, sampler, 64) == 0
    assert auto.round_groups(2, sampler, env_slots=64) == 8  # every env slot gets an episode
    sampler.record(("a", 1), [1.0] * 8), sampler.record(("b", 1), [0.0, 1.0] * 4)
    assert sampler.informative_share() == 0.5  # each task's observed share of mixed groups (a: 0, b: 1)
    assert auto.round_groups(5, sampler, env_slots=8) == 10
    assert auto.most_groups(5, sampler, env_slots=8) == 40  # rl.max_sampling_rounds rounds' worth
    for seed in range(2, 6):
        sampler.record(("b", seed), [0.0] * 8)  # b's share decays: 0.7^4
    assert auto.round_groups(5, sampler, env_slots=8) == 20  # at most 4x when few groups come out mixed
    assert GroupSampling(8, 16, 4, oversample=1.5).round_groups(5, sampler, env_slots=64) == 8
    # every complete group is kept (a critic's estimator): the first ones settle it, so no more are drawn
    assert GroupSampling(8, 16, 4, oversample=None, mixed_only=False).most_groups(5, sampler, env_slots=64) == 5


def test_streamed_groups_keep_the_same_data_on_any_layout(stage1_run):
    """At most six groups for the one informative group needed, streamed onto the env slots as they free up: the
    run ends once the first groups in draw order settle it, and the kept groups, the sampler's estimates and the
    next iteration (on slots left mid-episode, the others cancelled) are the same on one env slot, 2 workers of 4,
    or 2 of 2; every slot got an episode while groups were left to draw."""
    from ript.utils.distributed import DistInfo

    model, ckpt = load_model(stage1_run)
    render = ckpt["metadata"]["env_args"]["render"]
    settings = sampling_settings(ckpt["metadata"], {"temperature": 3.0}, ckpt["cfg"])
    runs, cancelled = [], []
    for workers, per_worker in ((1, 1), (2, 4), (2, 2)):
        policy = make_policy(model, settings, "cpu", seed=7)
        policy.start_recording()
        runner = EnvRunner(RunnerOptions("metaworld", ["drawer-close-v3"], render, 60, 1, num_workers=workers,
                                         envs_per_worker=per_worker, episodes_at_once=12))
        sampler = InitialConditionSampler(["drawer-close-v3"], seed=2, k=2)
        batches = []
        try:
            for it in range(2):
                sampler.start_iteration(it)
                batches.append(collect_groups(runner, policy, sampler, GroupSampling(2, 1, 1, 6.0), DistInfo()))
        finally:
            runner.close()
        assert runner.env_slots == workers * per_worker and all(len(b["kept"]) == 1 for b in batches)
        assert all(min(6, runner.env_slots // 2) <= b["groups_drawn"] <= 6 for b in batches)
        cancelled.append(sum(b["cancelled"] for b in batches))
        runs.append(([[(e["seed"], e["episode"], e["success"], e["length"], len(e["decisions"])) for e in g]
                      for b in batches for g in b["kept"]], sampler.state_dict()))
    assert runs[1] == runs[0] and runs[2] == runs[0]
    # one slot runs one group at a time, so nothing is left to cancel; with more slots, whether another group is
    # still running when the prefix settles depends on the workers' timing (a loaded host can finish them all first)
    assert cancelled[0] == 0


def test_informative_task_weighting_favours_tasks_with_mixed_outcomes():
    s = InitialConditionSampler(["solved", "mixed", "failed"], seed=0, task_weighting="informative", k=8)
    assert abs(s.task_probabilities() - 1 / 3).max() < 1e-9  # nothing seen yet: uniform
    s.record(("solved", 1), [1.0] * 8)
    s.record(("mixed", 1), [1.0, 0.0] * 4)
    s.record(("failed", 1), [0.0] * 8)
    p = s.task_probabilities()
    assert p[1] > 0.8 and p[0] == p[2] > 0  # floored, never starved
    draws = [s.draws().draw(g)[0] for g in range(200)]
    assert draws.count("mixed") > 150
    restored = InitialConditionSampler(["solved", "mixed", "failed"], seed=1, task_weighting="informative")
    restored.load_state_dict(s.state_dict())
    assert [restored.draws().draw(g) for g in range(5)] == [s.draws().draw(g) for g in range(5)]


def test_with_the_prior_one_failed_group_does_not_starve_a_task():
    """``rl.task_weighting_prior``: the estimates start where an unseen task's are (success 0.5), so a task whose
    first group of 8 all failed (a task at 20% often does, on a hard layout) is still drawn often; groups that keep
    failing fade it out."""
    def after(groups_failed: int, prior: bool) -> float:
        s = InitialConditionSampler(["rare", "mixed"], seed=0, task_weighting="informative", k=8, prior=prior)
        s.record(("mixed", 1), [1.0, 0.0] * 4)
        for g in range(groups_failed):
            s.record(("rare", g), [0.0] * 8)
        return float(s.task_probabilities()[0])

    assert after(1, prior=False) < 0.02  # the first group set it to 0: floored
    assert after(1, prior=True) > 0.45 and after(3, prior=True) > 0.4
    assert after(12, prior=True) < 0.15
    s = InitialConditionSampler(["a"], seed=0, task_weighting="informative", prior=True)
    s.record(("a", 1), [1.0] * 8)
    restored = InitialConditionSampler(["a"], seed=0, task_weighting="informative", prior=True)
    restored.load_state_dict(s.state_dict())
    assert restored.success == s.success == {"a": 0.65}  # 0.7 x 0.5 + 0.3 x 1
    # its share of mixed groups likewise starts where an unseen task's is (8 coin flips), not at this group's 0
    assert restored.mixed == s.mixed and abs(s.mixed["a"] - 0.7 * (1 - 2 * 0.5**8)) < 1e-12


def test_recorded_log_probs_equal_recomputed_ones(stage1_run):
    """The ratio at PPO step 0 is exactly 1: what is scored is what was sampled (top-k and temperature)."""
    model, ckpt = load_model(stage1_run)
    settings = {**sampling_settings(ckpt["metadata"], None, ckpt["cfg"]), "temperature": 0.8, "top_k": 5}
    policy = make_policy(model, settings, "cpu", seed=0)
    policy.start_recording()
    meta = ckpt["metadata"]
    runner = EnvRunner(RunnerOptions("metaworld", model.task_names, meta["env_args"]["render"], 20, 1,
                                     num_workers=1))
    try:
        out = runner.run(policy, specs=[EpisodeSpec("button-press-v3", 7, 0), EpisodeSpec("drawer-close-v3", 7, 1)])
    finally:
        runner.close()
    decisions = [d for e in out["episodes"] for d in e["decisions"]]
    assert len(decisions) == 2 * 3  # 20 steps, a new chunk every 8
    ctx = torch.stack([d["context"] for d in decisions])
    tokens = torch.stack([d["tokens"] for d in decisions])
    with torch.no_grad():
        recomputed = token_log_probs(model, ctx, tokens, 0.8, 5)
    assert torch.allclose(recomputed, torch.stack([d["log_probs"] for d in decisions]), atol=1e-5)


def test_a_recorded_decision_is_the_same_whichever_envs_share_its_batch(stage1_run, tiny_data):
    """RL's ratio uses the recorded log-probs bit for bit, and the runner plans whichever envs have answered:
    a recording chunk policy lays its batch out by env index, so env 1's decision (context, tokens, log-probs,
    actions) is identical planned alone, with envs 0 and 3, or with all four."""
    import h5py

    model, ckpt = load_model(stage1_run)
    settings = sampling_settings(ckpt["metadata"], {}, ckpt["cfg"])
    demo = sorted(tiny_data.rglob("*.hdf5"))[0]
    with h5py.File(demo, "r") as f:
        obs = f["data"][sorted(f["data"])[0]]["obs"]
        frames = [{k: obs[k][t] for k in model.image_keys + model.lowdim_keys} for t in range(4)]
    task = model.task_names[0]
    decisions = []
    for batch in ([1], [0, 1, 3], [0, 1, 2, 3]):
        policy = make_policy(model, settings, "cpu", seed=3)
        policy.start_recording()
        assert policy.fixed_layout
        policy.reset(4)
        for i in range(4):
            policy.reset_env(i, task, episode_key=i)
            policy.observe(i, frames[i])  # each env sees its own frame
        chunks = policy.act_chunk([i in batch for i in range(4)])
        decisions.append((chunks[1], policy.take_record(1)[0]))
    for chunk, record in decisions[1:]:
        assert np.array_equal(chunk, decisions[0][0])
        for key in ("context", "tokens", "log_probs"):
            assert torch.equal(record[key], decisions[0][1][key]), key


def test_encoders_train_from_recorded_observations_and_micro_batches_add_up(stage1_run):
    """With ``rl.train_prior_only=false`` the log-probs are recomputed from the recorded observations (equal to
    those sampled), the encoders receive gradient, and micro-batches accumulate to the minibatch's update."""
    model, ckpt = load_model(stage1_run)
    settings = {**sampling_settings(ckpt["metadata"], None, ckpt["cfg"]), "temperature": 2.0}
    policy = make_policy(model, settings, "cpu", seed=0)
    learner = ChunkLearner(model, settings, prior_only=False)
    learner.attach(policy)
    runner = EnvRunner(RunnerOptions("metaworld", model.task_names, ckpt["metadata"]["env_args"]["render"], 24, 1,
                                     num_workers=1))
    try:
        out = runner.run(policy, specs=[EpisodeSpec("button-press-v3", 7, 0), EpisodeSpec("drawer-close-v3", 7, 1)])
    finally:
        runner.close()
    decisions = [d for e in out["episodes"] for d in e["decisions"]]
    data = learner.collate(decisions, "cpu")
    assert "context" not in data and data["obs"]["corner_rgb"].dtype == torch.uint8
    with torch.no_grad():
        recomputed = learner.score(data, torch.arange(len(decisions))).log_probs
    assert torch.allclose(recomputed, data["old_log_probs"], atol=1e-5)
    cfg = compose("rl", [f"checkpoint={stage1_run}", "rl.micro_batch=2", "amp=false"])
    assert torch.allclose(rescore(learner, data, cfg, "cpu"), data["old_log_probs"], atol=1e-5)
    data["advantages"] = torch.linspace(-1, 1, len(decisions))

    encoder = "image_encoders.corner_rgb.proj.weight"
    before = {k: v.clone() for k, v in model.state_dict().items()}
    updated = []
    # the compiled path's static shapes: every micro-batch padded to 3 rows, the padding cut off again
    padded = ChunkLearner(model, settings, prior_only=False, static_batch=3)
    for micro, scorer in (("null", learner), ("2", learner), ("2", padded)):
        model.load_state_dict(before)
        cfg = compose("rl", [f"checkpoint={stage1_run}", "rl.epochs=1", "rl.minibatches=1", "rl.lr=1e-3",
                             f"rl.micro_batch={micro}", "amp=false"])
        opt = torch.optim.SGD(scorer.params, lr=1.0)  # the update is the gradient: sums compare directly
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: 1.0)
        stats = ppo_update(scorer, opt, sched, data, cfg, ddist.DistInfo(), 0, "cpu")
        updated.append(({k: v.clone() for k, v in model.state_dict().items()}, stats))
    (full, s_full), (micro, s_micro), (pad, s_pad) = updated
    assert max((pad[k] - micro[k]).abs().max().item() for k in full) < 1e-6
    assert abs(s_pad["policy_loss"] - s_micro["policy_loss"]) < 1e-7
    assert not torch.equal(full[encoder], before[encoder])  # the gradient reached the image encoder
    frozen = [k for k in full if k.startswith("autoencoder.")]
    assert frozen and all(torch.equal(full[k], before[k]) for k in frozen)  # the decoder stays stage 0's
    assert max((full[k] - micro[k]).abs().max().item() for k in full) < 1e-5
    assert abs(s_full["policy_loss"] - s_micro["policy_loss"]) < 1e-6



def test_rl_iteration_checkpoint_and_exact_resume(stage1_run, tmp_path):
    full = tmp_path / "full"
    rl.run(compose("rl", rl_overrides(stage1_run, full, 2) + ["rl.video_every=1"]))  # recording changes nothing
    assert [len(list((full / "videos" / f"iter{i:05d}").glob("*.mp4"))) for i in (1, 2)] == [1, 1]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(full / "tb"))
    events.Reload()
    gifs = events.Images("rollout/video/0")  # each iteration's rollout video, playable in TensorBoard
    assert [g.step for g in gifs] == [1, 2] and all(g.encoded_image_string.startswith(b"GIF89a") for g in gifs)
    # an iteration's wall time since the previous update: from the second on, the first one's checkpoint included
    cycle, iteration = ({e.step: e.value for e in events.Scalars(tag)} for tag in ("time/cycle", "time/iteration"))
    assert list(cycle) == [2] and cycle[2] > iteration[2]
    config = json.loads((full / "checkpoints" / "last" / "config.json").read_text())
    assert config["stage"] == "rl" and config["step"] == 2
    state = torch.load(full / "checkpoints" / "last" / "training_state.pt", weights_only=True)
    assert state["step"] == 2 and "sampler" in state["ranks"][0]
    model, _ = load_model(full, expect_stage="rl")
    base, _ = load_model(stage1_run)
    assert not torch.equal(model.head.weight, base.head.weight)  # the prior was updated
    assert torch.equal(model.image_encoders["corner_rgb"].proj.weight, base.image_encoders["corner_rgb"].proj.weight)

    # an RL checkpoint evaluates with the sampling settings it was trained with
    results = evaluate.run(compose("eval", [f"checkpoint={full}", "episodes_per_task=1", "num_workers=1",
                                            "max_episode_steps=8", f"out_dir={tmp_path / 'eval'}", "n_videos=0"]))
    assert results["sampling"]["temperature"] == 3.0

    part = tmp_path / "part"
    rl.run(compose("rl", rl_overrides(stage1_run, part, 1)))
    rl.run(compose("rl", rl_overrides(stage1_run, part, 2) + ["resume=true"]))
    a = load_file(str(full / "checkpoints" / "last" / "model.safetensors"))
    b = load_file(str(part / "checkpoints" / "last" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the rollout record and its picture continue across the resume as if uninterrupted
    history = json.loads((full / "rl_history.json").read_text())
    assert history == json.loads((part / "rl_history.json").read_text())
    assert [h["iteration"] for h in history] == [1, 2] and 0 < history[0]["env_steps"] < history[1]["env_steps"]
    assert (part / "rl_success.png").read_bytes().startswith(b"\x89PNG")


def test_rollout_history_drops_iterations_past_the_resumed_checkpoint(tmp_path):
    from ript.rl.history import RolloutHistory

    first = RolloutHistory(tmp_path, 0)
    for it in (1, 2, 3):  # iteration 3 logged, then a crash before its checkpoint
        first.add(it, episodes=4, successes=it, env_steps=100)
    resumed = RolloutHistory(tmp_path, 2)
    resumed.add(3, episodes=4, successes=0, env_steps=50)
    assert [(h["iteration"], h["env_steps"], h["success_rate"]) for h in resumed.entries] == \
        [(1, 100, 0.25), (2, 200, 0.5), (3, 250, 0.0)]
    assert json.loads((tmp_path / "rl_history.json").read_text()) == resumed.entries


def test_rl_never_hangs_when_no_group_is_informative(stage1_run, tmp_path, capsys):
    # one-step episodes: every rollout fails, every group has equal rewards
    overrides = rl_overrides(stage1_run, tmp_path / "r", 1) + [
        "rl.max_episode_steps=1", "rl.task_weighting=informative", "eval.every=1", "eval.episodes_per_task=1",
        "eval.num_workers=1", "eval.max_episode_steps=8", "eval.sampling.greedy=true"]
    rl.run(compose("rl", overrides))
    for iteration in ("iter0000", "iter0001"):  # evaluated before training and after the iteration
        evaluation = json.loads((tmp_path / "r" / "eval" / iteration / "results.json").read_text())
        assert evaluation["sampling"]["greedy"]  # the evaluations follow the mode; RL samples
    assert not load_model(tmp_path / "r")[1]["metadata"]["sampling"]["greedy"]
    assert "only 0 of 2 groups were informative after drawing" in capsys.readouterr().err
    assert (tmp_path / "r" / "checkpoints" / "last").exists()
    # a chunk policy's evaluation actions are not measured: a target on their shift is refused, not ignored
    shift_target = [*rl_overrides(stage1_run, tmp_path / "shift", 1), "rl.target_eval_shift=0.01"]
    assert_one_line_error(ript_here("rl", *shift_target), "rl.target_eval_shift=0.01", "rl.target_kl")
    assert not (tmp_path / "shift" / "checkpoints").exists()
    # nor has it a flow-matching loss to weight
    regression = [*rl_overrides(stage1_run, tmp_path / "fm", 1), "rl.flow_matching_coef=0.5"]
    assert_one_line_error(ript_here("rl", *regression), "rl.flow_matching_coef=0.5", "ChunkLearner")
    assert not (tmp_path / "fm" / "checkpoints").exists()


@pytest.mark.extended
@pytest.mark.skipif(sys.platform != "linux", reason="torchrun with gloo")
def test_rl_under_torchrun_survives_a_killed_rank_and_resumes_exactly(stage1_run, tmp_path):
    """Two gloo processes: a run whose second rank is killed after the first checkpoint ends at once (torchrun stops
    the other rank, nobody waits in a collective), keeps its checkpoints, and resumed gives the uninterrupted run."""
    def command(run_dir, *extra):
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
                "ript.cli", "rl", *rl_overrides(stage1_run, run_dir, 2), "rl.groups_per_iteration=2",
                "rl.num_workers=1", *extra]

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    straight, killed = tmp_path / "ddp", tmp_path / "ddp_killed"
    proc = subprocess.run(command(straight), capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = torch.load(straight / "checkpoints" / "last" / "training_state.pt", weights_only=True)
    assert len(state["ranks"]) == 2
    assert state["ranks"][0]["sampler"]["seed"] != state["ranks"][1]["sampler"]["seed"]  # the ranks draw apart
    # the per-task record counts both ranks' episodes, as the total does
    entry = json.loads((straight / "rl_history.json").read_text())[-1]
    assert sum(t["episodes"] for t in entry["per_task"].values()) == entry["episodes"] > 0

    run = subprocess.Popen(command(killed), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 300
        while not (killed / "checkpoints" / "0000001").exists():
            assert run.poll() is None and time.monotonic() < deadline, "no first checkpoint"
            time.sleep(0.2)
        ranks = [p["pid"] for p in processes() if p["ppid"] == run.pid and b"ript.cli" in p["cmdline"]]
        rank1 = next(pid for pid in ranks if b"\0RANK=1\0" in b"\0" + Path(f"/proc/{pid}/environ").read_bytes())
        os.kill(rank1, signal.SIGKILL)
        assert run.wait(timeout=60) != 0
    finally:
        run.kill()
    proc = subprocess.run(command(killed, "resume=true"), capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = (load_file(str(d / "checkpoints" / "last" / "model.safetensors")) for d in (straight, killed))
    assert all(torch.equal(a[k], b[k]) for k in a)

    # one process goes on from the two ranks' checkpoint only when told that it is not an exact resume
    one = [*rl_overrides(stage1_run, straight, 3), "rl.groups_per_iteration=2", "rl.num_workers=1", "resume=true"]
    assert_one_line_error(ript_here("rl", *one), "written by 2 process(es)", "resume_fewer_ranks=true")
    code, _, err = ript_here("rl", *one, "resume_fewer_ranks=true")
    assert code == 0, err[-3000:]
    assert any("written by 2 processes, continued on 1 (resume_fewer_ranks)" in line for line in err)
    assert [e["iteration"] for e in json.loads((straight / "rl_history.json").read_text())] == [1, 2, 3]


def test_the_rl_benchmark_times_a_real_iteration(tmp_path, monkeypatch):
    """benchmarks/bench_rl.py (the bench's RL part) runs rollouts and one update through the current RL API."""
    from benchmarks import bench_rl

    out = tmp_path / "bench_rl.json"
    monkeypatch.setattr(sys, "argv", ["bench_rl", "--overrides", "task.render.image_size=32", "algo=quest_small",
                                      "device=cpu", "--workers", "1", "--groups", "2", "--k", "2", "--steps", "24",
                                      f"--out={out}"])
    bench_rl.main()
    r = json.loads(out.read_text())["per_workers"]["1"]
    assert r["env_steps"] > 0 and r["decisions"] > 0 and r["train_s"] > 0
