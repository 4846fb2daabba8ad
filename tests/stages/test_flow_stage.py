"""``ript flow``: the flow policy's imitation stage resumes to the weights of an uninterrupted run, and its
settings are checked before a folder appears."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from ript.config import compose
from ript.stages import flow
from tests.helpers.cli import assert_one_line_error, flow_overrides, ript_here


def test_flow_training_resumes_exactly(tiny_data, flow_run, tmp_path):
    part = tmp_path / "part"
    flow.run(compose("flow", flow_overrides(tiny_data, part, 4) + ["train.stop_after_minutes=0"]))  # cut at step 1
    assert (part / "checkpoints" / "last").resolve().name == "0000001"
    flow.run(compose("flow", flow_overrides(tiny_data, part, 4) + ["resume=true"]))
    a = load_file(str(flow_run / "checkpoints" / "last" / "model.safetensors"))
    b = load_file(str(part / "checkpoints" / "last" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_flow_settings_are_checked_before_a_folder_appears(tiny_data, tmp_path):
    run = tmp_path / "run"
    assert_one_line_error(ript_here("flow", *flow_overrides(tiny_data, run, 2), "algo.action_horizon=9"),
                          "algo.action_horizon=9", "algo.chunk_size=8")
    assert_one_line_error(ript_here("flow", *flow_overrides(tiny_data, run, 2), "algo.model.time_sampling=logit"),
                          "algo.model.time_sampling")
    assert not run.exists()
