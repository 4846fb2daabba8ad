"""``rl.kl_coef``'s estimate of the KL to the checkpoint RL started from: never negative, zero where the policies
agree (RL runs with the penalty, resumed, in ``tests/rl/test_placement.py``)."""

from __future__ import annotations

import math

import torch

from ript.rl.objective import reference_kl


def test_the_kl_estimate_is_zero_for_equal_policies_and_skips_what_one_cannot_produce():
    new = torch.log(torch.tensor([[0.5, 0.25], [0.1, 0.9]]))
    assert reference_kl(new, new.clone()).item() == 0.0
    ref = torch.log(torch.tensor([[0.25, 0.25], [0.2, 0.9]]))
    d = (ref - new)[ref != new]
    assert math.isclose(reference_kl(new, ref).item(), float((d.exp() - d - 1).sum() / 4), rel_tol=1e-6)
    ref[0, 0] = -math.inf  # outside the reference's top-k: left out, not infinite
    assert math.isfinite(reference_kl(new, ref).item()) and reference_kl(new, ref).item() > 0
