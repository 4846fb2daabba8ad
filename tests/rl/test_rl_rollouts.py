"""RL's rollouts through the env runner: the decisions it records equal a one-env, every-frame oracle's, and
sampled episodes depend on their own seeds, not on how envs are batched or spread over workers."""

import torch

from ript.envs.runner import EnvRunner, RunnerOptions
from ript.envs.worker_env import EpisodeSpec
from ript.model_loader import load_model
from ript.policies.build import make_policy, sampling_settings
from tests.helpers.rollouts import step_by_step


def test_runner_matches_a_step_by_step_oracle(stage1_run, tmp_path):
    """Whole chunks per worker call, rendering only what a decision reads, for several envs in parallel,
    take the same decisions and end the same episodes as stepping one env at a time and observing every
    frame (greedy decoding, so the comparison does not depend on how envs are batched)."""
    model, ckpt = load_model(stage1_run)
    render = ckpt["metadata"]["env_args"]["render"]
    settings = sampling_settings(ckpt["metadata"], {"greedy": True}, ckpt["cfg"])
    specs = [EpisodeSpec("button-press-v3", 3, 0, record=True), EpisodeSpec("drawer-close-v3", 3, 1),
             EpisodeSpec("button-press-v3", 4, 2)]
    policy = make_policy(model, settings, "cpu", seed=0)
    policy.start_recording()
    runner = EnvRunner(RunnerOptions("metaworld", model.task_names, render, 30, 1, num_workers=2))
    try:
        out = runner.run(policy, video_dir=tmp_path, specs=specs)
    finally:
        runner.close()
    episodes = sorted(out["episodes"], key=lambda e: e["episode"])
    for spec, got in zip(specs, episodes):
        want = step_by_step(policy, spec, render, 30)
        assert (got["task"], got["seed"], got["success"], got["length"]) == \
            (want["task"], want["seed"], want["success"], want["length"])
        assert len(got["decisions"]) == len(want["decisions"]) > 1
        assert all(torch.equal(x["tokens"], y["tokens"]) for x, y in zip(got["decisions"], want["decisions"]))
    assert out["env_steps"] == sum(e["length"] for e in episodes)
    # the driver's wall time: waiting for workers, planning, and its own bookkeeping, each a part of it
    assert 0 < out["driver_idle_share"] < 1 and out["driver_idle_share"] + out["policy_share"] < 1
    assert [p.name for p in tmp_path.glob("*.mp4")] == [
        f"button-press-v3_ep0_{'success' if episodes[0]['success'] else 'failure'}.mp4"]


def test_sampled_episodes_depend_on_their_seeds_not_on_batching_or_workers(stage1_run):
    """Each episode samples from its own noise stream (seeded by its key and the run's draw of the policy's
    generator): the same specs give the same sampled decisions with 1 worker (batches of 1), 3 workers in two
    pipeline stages answering in whatever order (batches of 1 to 2), envs sharing a worker (3 in one; 2
    workers of 2 envs in lock-step), and 3 workers planned as each answers (``as_ready``), so results depend on
    neither the machine's core count nor the schedule nor the slot an episode lands in."""
    model, ckpt = load_model(stage1_run)
    render = ckpt["metadata"]["env_args"]["render"]
    settings = sampling_settings(ckpt["metadata"], {}, ckpt["cfg"])
    assert not settings["greedy"]
    specs = [EpisodeSpec(t, s, j) for j, (t, s) in enumerate([("button-press-v3", 3), ("drawer-close-v3", 3),
                                                               ("button-press-v3", 3), ("drawer-close-v3", 5)])]
    runs = []
    for workers, per_worker, stages, decisions in ((1, 1, 1, "lockstep"), (3, 1, 2, "lockstep"), (1, 3, 1, "lockstep"),
                                                   (2, 2, 1, "lockstep"), (3, 1, 1, "as_ready")):
        policy = make_policy(model, settings, "cpu", seed=7)
        policy.start_recording()
        runner = EnvRunner(RunnerOptions("metaworld", model.task_names, render, 24, 1, num_workers=workers,
                                         envs_per_worker=per_worker, pipeline_stages=stages,
                                         decisions=decisions))
        try:
            out = runner.run(policy, specs=specs)
        finally:
            runner.close()
        runs.append(sorted(out["episodes"], key=lambda e: e["episode"]))
        assert out["env_steps"] == sum(e["length"] for e in out["episodes"])
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert (a["success"], a["length"]) == (b["success"], b["length"])
            assert len(a["decisions"]) == len(b["decisions"]) == 3
            for x, y in zip(a["decisions"], b["decisions"]):
                assert torch.equal(x["tokens"], y["tokens"])
                torch.testing.assert_close(x["log_probs"], y["log_probs"])
    # two episodes of one layout (RL's K rollouts) still sample differently
    assert not all(torch.equal(x["tokens"], y["tokens"]) for x, y in zip(runs[0][0]["decisions"],
                                                                         runs[0][2]["decisions"]))
