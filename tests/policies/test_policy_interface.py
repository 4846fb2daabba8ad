"""The policy interface pinned: a third policy family, written only against ``ript/policies/base.py``, runs
through the env runner (frame stacks, whole chunks, recording) like the QueST and OpenVLA-OFT policies."""

import numpy as np
import pytest
import torch

from ript.envs.runner import EnvRunner, RunnerOptions
from ript.envs.worker_env import EpisodeSpec
from ript.policies.base import ChunkingPolicy
from ript.rl.learners import Scored
from tests.helpers.cli import TASKS
from tests.helpers.policies import NoisyHold

RENDER = {"cameras": ["corner"], "image_size": 32, "quality": "low"}


def test_a_third_policy_runs_through_the_runner():
    specs = [EpisodeSpec(TASKS[j % 2], 7 + j, j) for j in range(3)]
    outs = []
    for _ in range(2):  # seeded: the same policy seed gives the same episodes
        policy = NoisyHold(seed=3)
        policy.start_recording()
        runner = EnvRunner(RunnerOptions("metaworld", TASKS, RENDER, 12, 1, num_workers=2))
        try:
            outs.append(runner.run(policy, specs=specs))
        finally:
            runner.close()
    episodes = sorted(outs[0]["episodes"], key=lambda e: e["episode"])
    assert [e["length"] for e in episodes] == [12, 12, 12] and outs[0]["env_steps"] == 36
    for e in episodes:
        assert len(e["decisions"]) == 3  # ceil(12 / 5)
        assert all(d["task"] == e["task"] and d["stack"].shape == (2, 4) for d in e["decisions"])
        first = e["decisions"][0]["stack"]
        assert np.array_equal(first[0], first[1])  # an episode's first stack is padded with its first frame
        assert not np.array_equal(e["decisions"][1]["stack"][0], e["decisions"][1]["stack"][1])  # the arm moved
    assert policy.inference_seconds > 0
    assert outs[1]["decisions_per_plan"] * policy.plan_calls == pytest.approx(9)  # 3 episodes x 3 decisions
    # one slot runs two episodes in a row: at least 6 rounds of the 2-row batch, each row used at most once
    assert outs[1]["decisions"] == 9 and outs[1]["decision_rounds"] == policy.plan_calls >= 6
    assert outs[1]["slot_occupancy"] == pytest.approx(9 / (2 * policy.plan_calls))
    again = sorted(outs[1]["episodes"], key=lambda e: e["episode"])
    assert all(np.array_equal(a["stack"], b["stack"])
               for x, y in zip(episodes, again) for a, b in zip(x["decisions"], y["decisions"]))


def test_rl_switches_are_methods_and_record_is_read_only():
    policy = NoisyHold()
    assert not policy.record and policy.critic is None and not policy.deterministic
    with pytest.raises(AttributeError):
        policy.record = True  # the runner reads it; only start_recording / stop_recording switch it
    policy.start_recording(observations=True)
    assert policy.record and policy.record_observations
    policy.stop_recording()
    assert not policy.record and not policy.record_observations
    head = torch.nn.Linear(2, 1)
    policy.attach_critic(head)
    policy.set_deterministic(True)
    assert policy.critic is head and policy.deterministic


class GaussianHold(ChunkingPolicy):
    """A learnable Gaussian over action chunks (mean per task), recording what PPO rescores."""

    def __init__(self, model: torch.nn.Module, seed: int = 0, std: float = 0.3):
        self.model, self.std = model, std
        super().__init__(action_dim=4, action_horizon=5, frame_stack=1, device="cpu", seed=seed,
                         obs_keys=["robot_states"])

    def reset(self, n_envs: int, block: int | None = None) -> None:
        super().reset(n_envs, block)
        self.tasks = [0] * n_envs

    def start_task(self, i: int, task_name: str) -> None:
        self.tasks[i] = TASKS.index(task_name)

    @torch.no_grad()
    def plan(self, envs: list[int]) -> np.ndarray:
        task_ids = torch.tensor([self.tasks[i] for i in envs])
        mean = self.model.mean[task_ids]
        actions = mean + self.std * self.env_draws(envs, lambda g: torch.randn(mean.shape[1:], generator=g))
        log_probs = torch.distributions.Normal(mean, self.std).log_prob(actions).flatten(1)
        if self.record:
            for j, i in enumerate(envs):
                self.records[i].append({"task_id": int(task_ids[j]), "actions": actions[j], "log_probs": log_probs[j]})
        return actions.clamp(-1, 1).numpy()


class GaussianLearner:
    """The Learner protocol (ript/rl/learners.py) for GaussianHold."""

    compiles_update = False
    evaluation_shift_measured = False  # GaussianHold evaluates samples, as RL draws them
    regresses_chunks = False

    def __init__(self, model: torch.nn.Module, std: float):
        self.model, self.weights, self.std = model, model, std
        self.critic = None
        self.params = list(model.parameters())

    def attach(self, policy: ChunkingPolicy) -> None:
        policy.attach_critic(self.critic)
        policy.start_recording()

    def collate(self, decisions: list[dict], device: str) -> dict:
        return {"task_ids": torch.tensor([d["task_id"] for d in decisions]),
                "actions": torch.stack([d["actions"] for d in decisions]),
                "old_log_probs": torch.stack([d["log_probs"] for d in decisions])}

    def score(self, data: dict, idx: torch.Tensor) -> Scored:
        mean = self.model.mean[data["task_ids"][idx]]
        dist = torch.distributions.Normal(mean, self.std)
        return Scored(dist.log_prob(data["actions"][idx]).flatten(1), dist.entropy().flatten(1).mean(-1), None)

    def evaluation_actions(self, data: dict, idx: torch.Tensor) -> None:
        return None

    def write_extra(self, folder, whole=None) -> None:
        (folder / "gaussian.txt").write_text(f"std {self.std}\n")


def gaussian_model() -> torch.nn.Module:
    model = torch.nn.Module()
    model.mean = torch.nn.Parameter(torch.zeros(len(TASKS), 5, 4))
    return model


def test_a_third_policy_runs_an_rl_iteration(tmp_path):
    from ript.config import compose
    from ript.rl.advantages import build_estimator
    from ript.rl.loop import RLRun, init_rank, prepare_run, train_loop
    from ript.rl.rollout import flatten_groups, group_episodes, rollout_environment
    from ript.rl.update import ppo_update, rescore
    from ript.utils.checkpoint import load_weights

    cfg = compose("rl", ["checkpoint=none", f"run_dir={tmp_path / 'run'}", "device=cpu", "rl.iterations=1",
                         "rl.groups_per_iteration=2", "rl.rollouts_per_group=2", "rl.max_sampling_rounds=1",
                         "rl.num_workers=2", "rl.minibatches=1", "rl.epochs=2", "rl.lr=0.05", "eval.every=0"])
    metadata = {"suite": "metaworld", "env_args": {"render": RENDER, "max_episode_steps": 10}}
    model = gaussian_model()
    learner, policy = GaussianLearner(model, 0.3), GaussianHold(model, seed=1)
    device, info = init_rank(cfg)
    rollouts = rollout_environment(cfg, info, metadata, TASKS, policy, device)
    run_dir, resume_from = prepare_run(cfg, info)
    train_loop(RLRun(cfg, info, device, learner, policy, TASKS, metadata, {"stage": "rl", "model_name": "gaussian"},
                     run_dir, resume_from, lambda iteration, logger: None, rollouts))
    ckpt = run_dir / "checkpoints" / "last"
    assert (ckpt / "gaussian.txt").is_file() and set(load_weights(ckpt)) == {"mean"}

    # the update path on this policy's own decisions: recorded log-probs are those recomputed, PPO moves the mean
    runner = EnvRunner(RunnerOptions("metaworld", TASKS, RENDER, 10, 1, num_workers=2))
    try:
        specs = [EpisodeSpec(TASKS[g % 2], 3 * 10**9 + g, g * 2 + j) for g in range(2) for j in range(2)]
        groups = group_episodes(runner.run(policy, specs=specs)["episodes"], 2)
    finally:
        runner.close()
    decisions, _ = flatten_groups(groups, build_estimator(cfg.rl))
    data = learner.collate(decisions, "cpu")
    torch.testing.assert_close(rescore(learner, data, cfg, "cpu"), data["old_log_probs"])
    data["advantages"] = torch.linspace(-1, 1, len(decisions))
    before = model.mean.detach().clone()
    opt = torch.optim.AdamW(learner.params, lr=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: 1.0)
    stats = ppo_update(learner, opt, sched, data, cfg, info, 0, "cpu")
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=0.2) and not torch.equal(model.mean, before)


def test_old_log_probs_are_rescored_in_the_first_epochs_micro_batches():
    """``rl.recompute_old_log_probs`` scores the old policy in the very micro-batches the first epoch then trains
    on (in bf16 a log-prob depends on which decisions share its batch), each decision once, before any step."""
    from ript.config import compose
    from ript.rl.update import ppo_update
    from ript.utils.distributed import DistInfo

    class RecordingLearner(GaussianLearner):
        def __init__(self, model, std):
            super().__init__(model, std)
            self.calls: list[tuple[bool, list[int]]] = []

        def score(self, data: dict, idx: torch.Tensor) -> Scored:
            self.calls.append((torch.is_grad_enabled(), idx.tolist()))
            return super().score(data, idx)

    g = torch.Generator().manual_seed(0)
    n = 11
    data = {"task_ids": torch.randint(0, len(TASKS), (n,), generator=g), "actions": torch.randn(n, 5, 4, generator=g),
            "old_log_probs": torch.full((n, 20), float("nan")), "advantages": torch.randn(n, generator=g)}
    learner = RecordingLearner(gaussian_model(), 0.3)
    cfg = compose("rl", ["checkpoint=none", "rl.epochs=2", "rl.minibatches=2", "rl.micro_batch=3",
                         "rl.recompute_old_log_probs=true"])
    opt = torch.optim.SGD(learner.params, lr=0.1)
    stats = ppo_update(learner, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda it: 1.0), data, cfg, DistInfo(),
                       0, "cpu")
    rescoring = [idx for grad, idx in learner.calls if not grad]
    training_calls = [idx for grad, idx in learner.calls if grad]
    assert learner.calls[: len(rescoring)] == [(False, idx) for idx in rescoring]  # all before the first step
    assert sorted(i for idx in rescoring for i in idx) == list(range(n))
    assert training_calls[: len(rescoring)] == rescoring  # the first epoch's micro-batches, in its order
    assert training_calls[len(rescoring):] != rescoring  # the second epoch draws another order
    assert torch.isfinite(data["old_log_probs"]).all() and stats["ratio_mean"] == pytest.approx(1.0, abs=0.1)
