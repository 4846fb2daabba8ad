"""``ript world-model`` with a state network of its own trained on steps of the state alone (``algo.state_steps``):
the steps move it, the run resumes exactly, and asking for them without that network is one line."""

from __future__ import annotations

import torch

from ript.config import compose
from ript.stages import world_model
from tests.helpers.cli import assert_one_line_error, ript_here, world_model_overrides
from tests.helpers.weights import assert_same_weights, weights

DYNAMICS = ["algo.model.state_head=dynamics", "algo.state_steps=64"]


def test_state_steps_train_the_dynamics_head_and_the_run_resumes_exactly(tiny_data, tmp_path):
    whole, part, without = tmp_path / "whole", tmp_path / "part", tmp_path / "without"
    world_model.run(compose("world_model", [*world_model_overrides(tiny_data, whole, 4), *DYNAMICS]))
    world_model.run(compose("world_model", [*world_model_overrides(tiny_data, part, 4), *DYNAMICS,
                                            "train.stop_after_minutes=0"]))
    assert (part / "checkpoints" / "last").resolve().name == "0000001"
    world_model.run(compose("world_model", [*world_model_overrides(tiny_data, part, 4), *DYNAMICS, "resume=true"]))
    assert_same_weights(weights(part), weights(whole))
    world_model.run(compose("world_model", [*world_model_overrides(tiny_data, without, 4), DYNAMICS[0]]))
    trained, other = weights(whole), weights(without)
    head = [k for k in trained if k.startswith("state_head.")]
    assert head and not all(torch.equal(trained[k], other[k]) for k in head)


def test_state_steps_without_a_dynamics_head_are_one_line(tiny_data, tmp_path):
    run = tmp_path / "bad"
    assert_one_line_error(ript_here("world-model", *world_model_overrides(tiny_data, run, 2), "algo.state_steps=8"),
                          "algo.state_steps=8 trains a state network of its own: it needs "
                          "algo.model.state_head=dynamics (not bottleneck)")
    assert not run.exists()
