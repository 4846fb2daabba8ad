"""RL on a two-node Ray cluster of this host, with env workers as Ray actors (``workers.backend=ray``) or each
rank's rollouts in a Ray actor of their own (``placement.mode=disaggregated``): the same episodes and the same
updates as the collocated run on process workers (a run resumed across them included), the weights checked before
they travel, overlapped rollouts resumed exactly, and settings that cannot work as one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from ript.config import compose, override
from ript.envs.worker_env import EpisodeSpec, PoolSettings
from ript.errors import RiptError
from ript.policies.families import family_for
from ript.rl.placement import placement_kind
from ript.stages import rl
from ript.utils.distributed import DistInfo
from tests.helpers.cli import flow_rl_overrides, oft_rl_overrides, pi0_rl_overrides, rl_overrides
from tests.helpers.official_checkpoints import write_metaworld_oft_checkpoint, write_metaworld_pi0_checkpoint
from tests.helpers.ray_cluster import kill_actor, two_node_cluster

# one test process runs this file's tests (pytest-xdist, --dist loadgroup), so its module fixture is built once
pytestmark = pytest.mark.xdist_group("test_placement")


@pytest.fixture(scope="module")
def two_nodes():
    """A head and a second node, two CPUs each: a rollout actor and its two env-worker actors."""
    with two_node_cluster(2) as address:
        yield address


def disaggregated(address: str, env_workers: str) -> list[str]:
    return ["placement.mode=disaggregated", f"workers.backend={env_workers}", override("workers.ray_address", address)]


def scalars(run_dir, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def weights(run_dir) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "checkpoints" / "last" / "model.safetensors"))


def test_ray_env_workers_and_rollout_actors_give_the_collocated_episodes_and_updates_and_resume_exactly(
        two_nodes, stage1_run, tmp_path, capsys):
    """Two RL iterations collocated on process workers against the first on Ray env-worker actors spread over both
    nodes and the second, resumed from its checkpoint, in a rollout actor: the same episodes and weights. With a
    KL penalty to the start checkpoint (``rl.kl_coef``), whose anchor survives the resume."""
    local, remote = tmp_path / "collocated", tmp_path / "ray"
    kl = ["rl.kl_coef=0.5"]
    rl.run(compose("rl", rl_overrides(stage1_run, local, 2) + kl))
    rl.run(compose("rl", rl_overrides(stage1_run, remote, 1) + kl
                   + ["workers.backend=ray", override("workers.ray_address", two_nodes)]))
    assert "env workers: 2 Ray actors on 2 node(s)" in capsys.readouterr().err
    rl.run(compose("rl", rl_overrides(stage1_run, remote, 2) + kl + disaggregated(two_nodes, "processes")
                   + ["resume=true"]))
    assert "rollouts of rank 0: a Ray actor on node" in capsys.readouterr().err
    history = json.loads((local / "rl_history.json").read_text())
    assert history == json.loads((remote / "rl_history.json").read_text())
    a, b, start = weights(local), weights(remote), load_file(str(stage1_run / "checkpoints" / "last" /
                                                                  "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], start[k]) for k in a if k in start)  # the updates changed the weights
    # the second iteration starts away from the anchor, the first update having moved it
    assert dict(scalars(local, "actor/kl_to_reference"))[2] > 0


@pytest.mark.extended
def test_overlapped_rollouts_resume_exactly_and_need_a_rollout_actor(two_nodes, stage1_run, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    overlap = disaggregated(two_nodes, "processes") + ["rl.overlap=true"]
    rl.run(compose("rl", rl_overrides(stage1_run, straight, 2) + overlap))
    rl.run(compose("rl", rl_overrides(stage1_run, resumed, 2) + overlap + ["rl.stop_after_minutes=0"]))
    # stopped after the first iteration, whose checkpoint was written while the second's rollouts ran
    assert (resumed / "checkpoints" / "0000001" / "rollout_weights.safetensors").is_file()
    rl.run(compose("rl", rl_overrides(stage1_run, resumed, 2) + overlap + ["resume=true"]))
    assert json.loads((straight / "rl_history.json").read_text()) == \
        json.loads((resumed / "rl_history.json").read_text())
    a, b = weights(straight), weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(RiptError, match=r"rl.overlap=true needs placement.mode=disaggregated"):
        rl.run(compose("rl", rl_overrides(stage1_run, tmp_path / "local", 1) + ["rl.overlap=true"]))


@pytest.mark.extended
def test_overlapped_rollouts_under_torchrun_count_their_groups_beside_the_update(two_nodes, stage1_run, tmp_path):
    """Two trainer processes, each with the next iteration's rollouts running in its own rollout actor while it
    trains: the rollouts count their groups over a gloo group of their own while the update all-reduces on the
    default one, and both ranks' streams reach the checkpoint written while rollouts run ahead."""
    run_dir = tmp_path / "ddp_overlap"
    # with one group for both, the ranks' collectives interleave and the run hangs (ended by the timeout)
    said = torchrun_rl([*rl_overrides(stage1_run, run_dir, 2), "rl.groups_per_iteration=2", "rl.num_workers=1",
                        *disaggregated(two_nodes, "processes"), "rl.overlap=true"])
    assert all(f"rollouts of rank {rank}: a Ray actor on node" in said for rank in (0, 1))  # where each actor runs
    assert [e["iteration"] for e in json.loads((run_dir / "rl_history.json").read_text())] == [1, 2]
    first = run_dir / "checkpoints" / "0000001"
    assert (first / "rollout_weights.safetensors").is_file()  # written while the second iteration's rollouts ran
    state = torch.load(first / "training_state.pt", weights_only=True)
    assert len(state["ranks"]) == 2 and state["ranks"][0]["sampler"] != state["ranks"][1]["sampler"]


def torchrun_rl(overrides: list[str]) -> str:
    """Two trainer ranks under torchrun; their console output."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "ript.cli", "rl",
           *overrides]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


@pytest.mark.extended
def test_rl_sharded_with_fsdp_gives_the_unsharded_updates_and_resumes_on_its_gathered_checkpoint(
        two_nodes, stage1_run, tmp_path):
    """Two trainer processes with their rollouts in rollout actors: the model sharded over them (``rl.fsdp``),
    stopped after the first iteration and resumed from its checkpoint (weights and optimizer moments gathered
    whole, then sharded again), against the same run unsharded: the same episodes and the same weights. The ranks
    keep different numbers of decisions, so the sharded forwards run in step only with the padded micro-batches
    (without them the run hangs until the timeout)."""
    plain, sharded = tmp_path / "ddp", tmp_path / "fsdp"
    common = ["rl.groups_per_iteration=2", "rl.num_workers=1", "rl.micro_batch=4", "rl.recompute_old_log_probs=true",
              *disaggregated(two_nodes, "processes")]
    torchrun_rl([*rl_overrides(stage1_run, plain, 2), *common])
    # the ranks' waiting for each other, split between after the rollouts and the update's gradient averaging
    total, after_rollouts, in_update = (dict(scalars(plain, f"time/{t}")) for t in ("sync", "sync_rollout",
                                                                                     "sync_update"))
    assert list(total) == [1, 2] and all(after_rollouts[i] > 0 and in_update[i] >= 0 for i in total)
    assert any(in_update[i] > 0 for i in total)  # an iteration that updated averaged its gradients
    assert all(total[i] == pytest.approx(after_rollouts[i] + in_update[i]) for i in total)
    torchrun_rl([*rl_overrides(stage1_run, sharded, 2), *common, "rl.fsdp=true", "rl.stop_after_minutes=0"])
    assert [e["iteration"] for e in json.loads((sharded / "rl_history.json").read_text())] == [1]
    torchrun_rl([*rl_overrides(stage1_run, sharded, 2), *common, "rl.fsdp=true", "resume=true"])
    # the same episodes; the updates' statistics agree up to the order sharding sums in
    straight, resharded = (json.loads((d / "rl_history.json").read_text()) for d in (plain, sharded))
    assert [e.pop("update") for e in resharded] == [pytest.approx(e.pop("update"), rel=1e-5) for e in straight]
    assert straight == resharded
    a, b, start = weights(plain), weights(sharded), load_file(str(stage1_run / "checkpoints" / "last" /
                                                                  "model.safetensors"))
    assert sorted(a) == sorted(b) and any(not torch.equal(a[k], start[k]) for k in a if k in start)
    # whole tensors, loadable by one process. Sharding sums the gradients in another order, and Adam scales
    # float noise up to a step of rl.lr (1e-3) where a gradient is zero in exact arithmetic (the attention's key
    # bias: 2e-5 apart); reloading the optimizer's moments wrongly would be a whole step apart
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=5e-5, rtol=0)
    with pytest.raises(RiptError, match=r"rl.fsdp=true: set placement.mode=disaggregated"):
        rl.run(compose("rl", rl_overrides(stage1_run, tmp_path / "local", 1) + ["rl.fsdp=true"]))


def test_the_two_phase_loop_with_disaggregated_rollouts_or_an_unknown_placement_is_one_line(
        two_nodes, stage1_run, tmp_path):
    cfg = compose("rl", rl_overrides(stage1_run, tmp_path / "rl", 1) + disaggregated(two_nodes, "processes")
                  + ["+environment.refresh_every=1"])
    with pytest.raises(RiptError, match=r"environment.refresh_every .* needs placement.mode=collocated"):
        rl.run(cfg)
    with pytest.raises(RiptError, match=r"unknown rollout placement 'sideways'; registered: collocated, "
                                        r"disaggregated, hybrid$"):
        rl.run(compose("rl", rl_overrides(stage1_run, tmp_path / "rl", 1) + ["placement.mode=sideways"]))
    assert not (tmp_path / "rl").exists()


def test_hybrid_placement_splits_the_gpus_by_role_and_refuses_what_cannot_work(stage1_run, monkeypatch):
    """``placement.mode=hybrid``: every rank's simulators render on ``placement.env_gpus`` and its rollout actor
    acts on another GPU, the two pipelined; settings that cannot work, and an actor Ray put where the simulators
    render, are one line. (The placement itself needs GPUs: measured in docs/distributed.md.)"""
    from ript.rl.overlap import check_overlap
    from ript.rl.placement import Disaggregated, Hybrid, rolls_out_remotely

    def cfg(*extra):
        return compose("rl", [f"checkpoint={stage1_run}", "placement.mode=hybrid", *extra])

    with pytest.raises(RiptError, match=r"placement.mode=hybrid splits .* use placement.mode=disaggregated"):
        Hybrid.check_settings(cfg("placement.env_gpus=[0]"), "cpu", 0.5)
    with pytest.raises(RiptError, match=r"set placement.env_gpus to the GPUs the simulators render on"):
        Hybrid.check_settings(cfg(), "cuda:1", 0.5)
    with pytest.raises(RiptError, match=r"set placement.rollout_gpus to each rollout actor's share"):
        Hybrid.check_settings(cfg("placement.env_gpus=[0]"), "cuda:1", 0)
    Hybrid.check_settings(cfg("placement.env_gpus=[0]"), "cuda:1", 0.5)

    assert Hybrid.kept_from_ray(cfg("placement.env_gpus=[0,2]"), (1,), 0.5) == (0, 2)  # a Ray the job starts
    assert Disaggregated.kept_from_ray(cfg(), (1,), 1.0) == (1,) and Disaggregated.kept_from_ray(cfg(), (1,), 0.5) == ()
    settings = Hybrid.actor_settings(cfg("placement.env_gpus=[0,2]"), (1,))
    assert settings["workers"]["render_gpus"] == [0, 2] and settings["workers"]["pipeline_stages"] == 2
    assert Disaggregated.actor_settings(cfg(), (1,))["workers"]["render_gpus"] == [1]  # the trainer's GPU
    # an actor's env workers share the host's memory with the other ranks' actors, as the ranks' own would
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    actor_workers = Hybrid.actor_settings(cfg("placement.env_gpus=[0]"), (1,))["workers"]
    assert actor_workers["host_sets"] == 2 and PoolSettings.from_config(OmegaConf.create(actor_workers)).host_sets == 2
    assert Disaggregated.actor_settings(cfg("workers.host_sets=3"), (1,))["workers"]["host_sets"] == 3
    hybrid = cfg("placement.env_gpus=[0]")
    assert "GPU 0, where the simulators render (placement.env_gpus=[0])" in Hybrid.misplaced(hybrid, 0, (1,), 0.5, 1)
    assert Hybrid.misplaced(hybrid, 1, (1,), 0.5, 1) is None  # beside its trainer, as the mode means
    assert Hybrid.misplaced(hybrid, None, (1,), 0.5, 1) is None  # on another node
    assert "which this rank trains on" in Disaggregated.misplaced(hybrid, 1, (1,), 1.0, 0)
    assert Disaggregated.misplaced(hybrid, 1, (1,), 0.5, 0) is None  # a share of it, as asked

    assert [rolls_out_remotely(cfg(f"placement.mode={m}")) for m in ("collocated", "disaggregated", "hybrid")] == \
        [False, True, True]
    check_overlap(cfg("rl.overlap=true"))  # overlap needs rollouts in actors: hybrid has them
    with pytest.raises(RiptError, match=r"rl.overlap=true needs placement.mode=disaggregated or hybrid"):
        check_overlap(cfg("rl.overlap=true", "placement.mode=collocated"))


def test_a_dead_rollout_actor_ends_the_run_with_one_line(two_nodes, stage1_run):
    cfg = compose("rl", [f"checkpoint={stage1_run}", "task_names=[drawer-close-v3]", "rl.num_workers=1",
                         "rl.max_episode_steps=8"] + disaggregated(two_nodes, "processes"))
    family = family_for(cfg)
    loaded = family.load(cfg, "cpu", 0, rl=True)
    placement = placement_kind(cfg)(cfg=cfg, info=DistInfo(), loaded=loaded, device="cpu")
    try:
        learner = family.learner(loaded, cfg, "cpu", None)
        placement.attach(learner)
        specs = [EpisodeSpec("drawer-close-v3", 0, 0)]
        placement.sync()
        assert placement.runner.run(loaded.policy, specs=specs)["env_steps"] == 8
        kill_actor(placement.actor)
        with pytest.raises(RiptError, match=r"the rollout actor of rank 0 died before it could receive the weights "
                                            r".*resumes from its last checkpoint with resume=true"):
            placement.sync()
    finally:
        placement.runner.close()




def assert_sharded_run_matches(plain, sharded) -> list:
    """A policy's run under ``rl.fsdp`` against the same run unsharded: the same episodes, the
    updates' statistics and the weights and critic up to the order sharding sums in. Returns the unsharded run's
    evaluation shifts, which only a whole model measures (no forward on one rank alone)."""
    straight, resharded = (json.loads((d / "rl_history.json").read_text()) for d in (plain, sharded))
    shifts = [e["update"].pop("eval_action_shift", None) for e in straight]
    assert [e.pop("update") for e in resharded] == [pytest.approx(e.pop("update"), rel=1e-4) for e in straight]
    assert straight == resharded
    for name in ("model.safetensors", "critic.safetensors"):
        a, b = (load_file(str(d / "checkpoints" / "last" / name)) for d in (plain, sharded))
        assert sorted(a) == sorted(b) and a
        for k in a:
            torch.testing.assert_close(b[k], a[k], atol=5e-5, rtol=0)
    return shifts


@pytest.mark.extended
def test_a_flow_policy_sharded_with_fsdp_gives_the_unsharded_updates(two_nodes, flow_run, tmp_path):
    """The flow policy (Flow-Noise, a critic after the expert) trained by two ranks with rollout actors, its model
    sharded (``rl.fsdp``): the episodes and, up to the order sharding sums in, the weights and critic of the same
    run unsharded. Scoring runs the model's ``encode``, ``expert`` and ``noise_std`` and its layers'
    ``prefix_keys_values``, each gathered around as a forward is."""
    plain, sharded = tmp_path / "ddp", tmp_path / "fsdp"
    common = ["rl.groups_per_iteration=2", "rl.num_workers=1", "rl.micro_batch=4", "rl.recompute_old_log_probs=true",
              "policy.noise_method=flow_noise", "rl.advantage=gae", *disaggregated(two_nodes, "processes")]
    torchrun_rl([*flow_rl_overrides(flow_run, plain, 1), *common])
    torchrun_rl([*flow_rl_overrides(flow_run, sharded, 1), *common, "rl.fsdp=true"])
    assert all(shift > 0 for shift in assert_sharded_run_matches(plain, sharded))
    start, trained = (load_file(str(d / "checkpoints" / "last" / "model.safetensors")) for d in (flow_run, sharded))
    assert not torch.equal(trained["velocity_out.weight"], start["velocity_out.weight"])  # the update moved it


@pytest.mark.extended
def test_pi0_sharded_with_fsdp_gives_the_unsharded_updates(two_nodes, tmp_path):
    """π0 (the tiny official folder, its action expert training) by two ranks with rollout actors, sharded: the
    episodes, and up to the order sharding sums in, the trained weights and critic of the same run unsharded."""
    folder = write_metaworld_pi0_checkpoint(tmp_path / "pi0_tiny")
    plain, sharded = tmp_path / "ddp", tmp_path / "fsdp"
    common = ["rl.groups_per_iteration=2", "rl.micro_batch=2", "rl.recompute_old_log_probs=true",
              *disaggregated(two_nodes, "processes")]
    torchrun_rl([*pi0_rl_overrides(folder, plain, 1), *common])
    torchrun_rl([*pi0_rl_overrides(folder, sharded, 1), *common, "rl.fsdp=true"])
    assert_sharded_run_matches(plain, sharded)


@pytest.mark.extended
def test_openvla_oft_sharded_with_fsdp_gives_the_unsharded_updates(two_nodes, tmp_path):
    """OpenVLA-OFT (the tiny official folder; LoRA, its scale head and a critic, built fresh on each rank from the
    run's seed) by two ranks with rollout actors, sharded: the episodes, the updates and the adapter, heads and
    critic of the same run unsharded."""
    folder = write_metaworld_oft_checkpoint(tmp_path / "oft_tiny")
    plain, sharded = tmp_path / "ddp", tmp_path / "fsdp"
    common = ["rl.compile=false", "rl.recompute_old_log_probs=true", *disaggregated(two_nodes, "processes")]
    torchrun_rl([*oft_rl_overrides(folder, plain, 1), *common])
    torchrun_rl([*oft_rl_overrides(folder, sharded, 1), *common, "rl.fsdp=true"])
    assert_sharded_run_matches(plain, sharded)
