"""Recorded episodes are written off the driving thread and merged per task in seed and episode order."""

import h5py
import numpy as np
import pytest

from ript.data.hdf5 import read_demos
from ript.errors import RiptError
from ript.evaluation.recording import MAX_PENDING, EpisodeFiles

METADATA = {"suite": "metaworld", "env_args": {}}
KEYS = {"corner_rgb": "corner_rgb", "robot_states": "robot_states"}


def episode(seed: int, index: int, length: int, success: bool) -> dict:
    rng = np.random.default_rng(seed * 100 + index)
    obs = [{"corner_rgb": rng.integers(0, 255, (8, 8, 3), dtype=np.uint8),
            "robot_states": rng.normal(size=4).astype(np.float32)} for _ in range(length)]
    actions = [rng.normal(size=4) for _ in range(length)]  # float64 rows, stored as float32
    return {"task": "drawer-close-v3", "seed": seed, "episode": index, "success": success,
            "steps": {"obs": obs, "actions": actions}}


def test_episodes_handed_in_any_order_are_merged_in_seed_and_episode_order(tmp_path):
    files = EpisodeFiles(tmp_path / "episodes", METADATA, {"drawer-close-v3": "close the drawer"})
    handed = [episode(seed, i, 3 + (seed + i) % 4, bool(i % 2)) for seed, i in
              [(7, 2), (5, 0), (7, 0), (5, 1), *[(9, k) for k in range(MAX_PENDING + 2)]]]  # past the bound
    for e in handed:
        files(e)
    assert files.finish() == [tmp_path / "episodes" / "drawer-close-v3.hdf5"]
    assert sorted(p.name for p in (tmp_path / "episodes").iterdir()) == ["drawer-close-v3.hdf5"]
    demos = read_demos(tmp_path / "episodes" / "drawer-close-v3.hdf5", KEYS)
    expected = sorted(handed, key=lambda e: (e["seed"], e["episode"]))
    assert [(d.attrs["layout_seed"], d.attrs["episode"]) for d in demos] == [(e["seed"], e["episode"])
                                                                           for e in expected]
    with h5py.File(tmp_path / "episodes" / "drawer-close-v3.hdf5") as f:
        rewards = [f[f"data/demo_{i}/rewards"][-1] for i in range(len(expected))]
        assert rewards == [int(e["success"]) for e in expected]
    for d, e in zip(demos, expected):
        frames = np.stack([o["corner_rgb"] for o in e["steps"]["obs"]])
        assert np.array_equal(d.obs["corner_rgb"], frames)
        assert np.array_equal(d.actions, np.stack(e["steps"]["actions"]).astype(np.float32))
        assert bool(d.attrs["success"]) == e["success"]


def test_an_episode_that_cannot_be_written_is_one_error_naming_its_file(tmp_path):
    blocked = tmp_path / "episodes"
    blocked.write_text("a file where the folder should be")
    files = EpisodeFiles(blocked, METADATA, {"drawer-close-v3": "close the drawer"})
    files(episode(1, 0, 3, True))
    with pytest.raises(RiptError, match=r"\.drawer-close-v3\.seed1\.episode00000\.hdf5: the episode could not be"):
        files.finish()
    assert blocked.read_text() == "a file where the folder should be"
