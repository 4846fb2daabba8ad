"""``ript flow``: the flow policy's imitation stage resumes to the weights of an uninterrupted run, starts from a
base trained on other tasks, and its settings are checked before a folder appears."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from ript.config import compose
from ript.errors import RiptError
from ript.stages import flow, stage0
from tests.helpers.cli import assert_one_line_error, flow_overrides, ript_here, train_overrides
from tests.helpers.weights import assert_same_weights, weights


def test_flow_training_resumes_exactly(tiny_data, flow_run, tmp_path):
    part = tmp_path / "part"
    flow.run(compose("flow", flow_overrides(tiny_data, part, 4) + ["train.stop_after_minutes=0"]))  # cut at step 1
    assert (part / "checkpoints" / "last").resolve().name == "0000001"
    flow.run(compose("flow", flow_overrides(tiny_data, part, 4) + ["resume=true"]))
    a = load_file(str(flow_run / "checkpoints" / "last" / "model.safetensors"))
    b = load_file(str(part / "checkpoints" / "last" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_weight_average_is_what_checkpoints_hold_leaves_training_alone_and_resumes_exactly(tiny_data, flow_run,
                                                                                           tmp_path):
    averaged = flow_overrides(tiny_data, tmp_path / "whole", 4) + ["train.ema_decay=0.5"]
    flow.run(compose("flow", averaged))
    last = tmp_path / "whole" / "checkpoints" / "last"
    trained = load_file(str(last / "trained_weights.safetensors"))
    held = weights(tmp_path / "whole")
    plain = weights(flow_run)  # the same run without the average: the same training, validation between steps
    assert all(torch.equal(trained[k], plain[k]) for k in trained)
    assert any(not torch.equal(trained[k], held[k]) for k in trained)  # the checkpoint holds the average
    part = tmp_path / "part"
    cut = [o.replace(str(tmp_path / "whole"), str(part)) for o in averaged]
    flow.run(compose("flow", cut + ["train.stop_after_minutes=0"]))
    kept = part / "checkpoints" / "last" / "trained_weights.safetensors"
    kept.rename(kept.with_suffix(".moved"))  # a checkpoint without its trained weights does not resume
    with pytest.raises(RiptError, match="trained_weights.safetensors"):
        flow.run(compose("flow", cut + ["resume=true"]))
    kept.with_suffix(".moved").rename(kept)
    flow.run(compose("flow", cut + ["resume=true"]))
    assert_same_weights(weights(part), held)
    assert_same_weights(load_file(str(part / "checkpoints" / "last" / "trained_weights.safetensors")), trained)
    # stage 0's own loop likewise
    s0 = lambda run: train_overrides(tiny_data, run, 3) + ["train.ema_decay=0.5"]  # noqa: E731
    stage0.run(compose("stage0", s0(tmp_path / "s0_whole")))
    stage0.run(compose("stage0", s0(tmp_path / "s0_part") + ["train.stop_after_minutes=0"]))
    stage0.run(compose("stage0", s0(tmp_path / "s0_part") + ["resume=true"]))
    assert_same_weights(weights(tmp_path / "s0_part"), weights(tmp_path / "s0_whole"))


def test_flow_settings_are_checked_before_a_folder_appears(tiny_data, tmp_path):
    run = tmp_path / "run"
    assert_one_line_error(ript_here("flow", *flow_overrides(tiny_data, run, 2), "algo.action_horizon=9"),
                          "algo.action_horizon=9", "algo.chunk_size=8")
    assert_one_line_error(ript_here("flow", *flow_overrides(tiny_data, run, 2), "algo.model.time_sampling=logit"),
                          "algo.model.time_sampling")
    assert_one_line_error(ript_here("flow", *flow_overrides(tiny_data, run, 2), "train_expert_only=true"),
                          "train_expert_only", "init_checkpoint")
    assert not run.exists()


def test_a_flow_policy_starts_from_a_base_on_other_tasks_with_its_weights_and_normalisation(tiny_data, flow_run,
                                                                                          stage0_run, tmp_path):
    run = tmp_path / "drawer"
    # one of the base's two tasks, trained for one step at a learning rate of 1e-30: everything the base learnt
    # carries over, the per-task conditioning is this run's
    own = flow_overrides(tiny_data, run, 1) + ["task.task_names=[drawer-close-v3]", "train.lr=1e-30",
                                               "train.warmup_steps=0"]
    flow.run(compose("flow", own + [f"init_checkpoint={flow_run}"]))
    base, started = weights(flow_run), weights(run)
    assert started["task_embeddings"].shape[0] == 1 and base["task_embeddings"].shape[0] == 2
    assert torch.equal(started["task_embeddings"][0], base["task_embeddings"][1])  # the drawer's instruction
    assert_same_weights({k: v for k, v in started.items() if k != "task_embeddings"},
                        {k: v for k, v in base.items() if k != "task_embeddings"})
    fresh = tmp_path / "fresh"
    flow.run(compose("flow", [o.replace(str(run), str(fresh)) for o in own]))
    assert not torch.equal(weights(fresh)["action_normalizer.scale"], base["action_normalizer.scale"])
    other = tmp_path / "other"
    assert_one_line_error(ript_here("flow", *flow_overrides(tiny_data, other, 1), f"init_checkpoint={flow_run}",
                                    "algo.model.dim=48"), "init_checkpoint", "dim=")
    assert_one_line_error(ript_here("flow", *flow_overrides(tiny_data, other, 1), f"init_checkpoint={tmp_path}"),
                          "init_checkpoint", str(tmp_path))
    assert_one_line_error(ript_here("flow", *flow_overrides(tiny_data, other, 1), f"init_checkpoint={stage0_run}"),
                          "init_checkpoint", "stage0")
    assert not other.exists()


EXPERT_PARTS = ("action_pos", "action_in.", "time_mlp.", "blocks.", "out_modulation.", "velocity_out.", "noise_head.")


def test_from_a_base_the_action_expert_can_train_alone(tiny_data, flow_run, tmp_path):
    run = tmp_path / "expert_only"
    flow.run(compose("flow", flow_overrides(tiny_data, run, 2) + [f"init_checkpoint={flow_run}",
                                                                  "train_expert_only=true", "train.lr=1e-2"]))
    base, started = weights(flow_run), weights(run)
    kept = [k for k in base if not k.startswith(EXPERT_PARTS) and k != "task_embeddings"]
    assert kept and all(torch.equal(started[k], base[k]) for k in kept)  # the prefix and encoders as the base's
    assert not torch.equal(started["velocity_out.weight"], base["velocity_out.weight"])
