"""A policy's random stream restored from a checkpoint: continued exactly, or refused in one line when the saved
state is another device kind's."""

from __future__ import annotations

import pytest
import torch

from ript.errors import RiptError
from ript.utils.seeding import restore_generator


def test_a_restored_generator_continues_the_saved_stream():
    saved = torch.Generator().manual_seed(3)
    torch.rand(5, generator=saved)
    state = saved.get_state()
    expected = torch.rand(4, generator=saved)
    fresh = torch.Generator().manual_seed(0)
    restore_generator(fresh, state, "ckpt", "data_rng")
    assert torch.equal(torch.rand(4, generator=fresh), expected)


def test_a_state_of_another_device_kind_is_a_one_line_error():
    # a CUDA generator's state is its seed and offset (16 bytes); a CPU generator's is the Mersenne Twister's
    cuda_like = torch.zeros(16, dtype=torch.uint8)
    with pytest.raises(RiptError, match=r"runs/rl/checkpoints/0000012: .* another device kind .*\(cpu\)") as err:
        restore_generator(torch.Generator(), cuda_like, "runs/rl/checkpoints/0000012", "policy_rng")
    assert "\n" not in str(err.value)
