"""``rl.kl_coef``: a KL penalty to the checkpoint RL started from. The estimate is never negative and zero where
the policies agree; the anchor is the start checkpoint's weights even in a resumed run (which then repeats the
uninterrupted one)."""

from __future__ import annotations

import math

import torch
from safetensors.torch import load_file

from ript.config import compose
from ript.rl.objective import reference_kl
from ript.stages import rl
from tests.helpers.cli import rl_overrides


def test_the_kl_estimate_is_zero_for_equal_policies_and_skips_what_one_cannot_produce():
    new = torch.log(torch.tensor([[0.5, 0.25], [0.1, 0.9]]))
    assert reference_kl(new, new.clone()).item() == 0.0
    ref = torch.log(torch.tensor([[0.25, 0.25], [0.2, 0.9]]))
    d = (ref - new)[ref != new]
    assert math.isclose(reference_kl(new, ref).item(), float((d.exp() - d - 1).sum() / 4), rel_tol=1e-6)
    ref[0, 0] = -math.inf  # outside the reference's top-k: left out, not infinite
    assert math.isfinite(reference_kl(new, ref).item()) and reference_kl(new, ref).item() > 0


def kl_scalars(run_dir) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars("actor/kl_to_reference")]


def test_the_anchor_is_the_start_checkpoint_and_a_resumed_run_repeats_the_uninterrupted_one(stage1_run, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    kl = ["rl.kl_coef=0.5"]
    rl.run(compose("rl", rl_overrides(stage1_run, straight, 2) + kl))
    rl.run(compose("rl", rl_overrides(stage1_run, resumed, 1) + kl))
    rl.run(compose("rl", rl_overrides(stage1_run, resumed, 2) + kl + ["resume=true"]))
    a = load_file(str(straight / "checkpoints" / "last" / "model.safetensors"))
    b = load_file(str(resumed / "checkpoints" / "last" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    steps = dict(kl_scalars(straight))
    assert steps[2] > 0  # the second iteration starts away from the anchor, the first update having moved it
