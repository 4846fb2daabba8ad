"""A policy's random stream restored from a checkpoint: continued exactly, or refused in one line when the saved
state is another device kind's; draws shared by every rank, which leave each rank's own stream where it was."""

from __future__ import annotations

import pytest
import torch

from ript.errors import RiptError
from ript.utils.seeding import restore_generator, shared_draws


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


def test_shared_draws_are_the_same_on_every_rank_and_leave_the_rank_stream_untouched():
    """Two ranks seeded apart (``seed + rank``) build the same fresh weights inside ``shared_draws(seed)``, and
    each rank's own stream then continues as if those draws had not been made."""
    built, after, expected = [], [], []
    for rank in (0, 1):
        torch.manual_seed(7 + rank)
        expected.append(torch.rand(3))
        torch.manual_seed(7 + rank)
        with shared_draws(7, "cpu"):
            built.append(torch.nn.Linear(4, 4).weight.detach().clone())
        after.append(torch.rand(3))
    assert torch.equal(built[0], built[1])
    assert all(torch.equal(a, e) for a, e in zip(after, expected)) and not torch.equal(after[0], after[1])
