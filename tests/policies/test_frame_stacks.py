import numpy as np
import pytest

from ript.errors import RiptError
from ript.policies.frame_stacks import FrameStacks


def frame(value: int) -> dict[str, np.ndarray]:
    return {"rgb": np.full((2, 2, 3), value, dtype=np.uint8), "state": np.full(3, value / 10, dtype=np.float32)}


def test_an_episode_starts_padded_with_its_first_frame_and_then_shifts():
    stacks = FrameStacks(n_envs=2, depth=3, pin=False)
    stacks.put(0, frame(1))
    assert stacks.arrays["rgb"][0, :, 0, 0, 0].tolist() == [1, 1, 1]
    stacks.put(0, frame(2))
    stacks.put(0, frame(3))
    stacks.put(0, frame(4))
    assert stacks.arrays["rgb"][0, :, 0, 0, 0].tolist() == [2, 3, 4]
    assert stacks.arrays["state"].dtype.is_floating_point and stacks.arrays["rgb"].dtype.itemsize == 1
    stacks.begin(0)  # a new episode in env 0: its first frame fills the stack again
    stacks.put(0, frame(9))
    assert stacks.arrays["rgb"][0, :, 0, 0, 0].tolist() == [9, 9, 9]
    assert stacks.arrays["rgb"][1].sum() == 0  # env 1 has seen nothing


def test_a_batch_of_scattered_rows_is_a_copy_and_of_consecutive_rows_a_view():
    stacks = FrameStacks(n_envs=3, depth=1, pin=False)
    for i in range(3):
        stacks.put(i, frame(i + 1))
    some = stacks.batch([2, 0])
    assert some["rgb"][:, 0, 0, 0, 0].tolist() == [3, 1]
    stacks.put(2, frame(7))
    assert some["rgb"][0, 0, 0, 0, 0] == 3  # a gathered batch does not change with later frames
    assert stacks.batch([1, 2])["rgb"].data_ptr() == stacks.arrays["rgb"][1].data_ptr()  # consecutive: a view


def test_a_frame_of_another_shape_names_its_key():
    stacks = FrameStacks(n_envs=1, depth=1, pin=False)
    stacks.put(0, frame(1))
    with pytest.raises(RiptError, match="'rgb' has shape"):
        stacks.put(0, {"rgb": np.zeros((4, 4, 3), dtype=np.uint8)})

