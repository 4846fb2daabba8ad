"""benchmarks/state_predictability.py on demonstration files whose state moves by a fixed linear map of the actions:
a linear map predicts it to rounding, holding the state does not, and the network's fed-back error is measured at
every chunk of the horizon."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from benchmarks.state_predictability import Chunks, fed_back, fit_linear, fit_network, load_demos, rmse


def write_demos(path, seed: int, demos: int = 4, steps: int = 30) -> None:
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        for i in range(demos):
            actions = rng.uniform(-1, 1, (steps, 3)).astype(np.float32)
            state = np.cumsum(np.concatenate([rng.normal(size=(1, 2)), 0.1 * actions[:-1, :2]]), axis=0)
            f.create_dataset(f"data/demo_{i}/obs/robot_states", data=state.astype(np.float32))
            f.create_dataset(f"data/demo_{i}/actions", data=actions)


def test_a_state_that_moves_linearly_with_the_actions_is_predicted_by_the_linear_map(tmp_path):
    for seed in range(2):
        write_demos(tmp_path / f"task{seed}_demo.hdf5", seed)
    demos = load_demos(str(tmp_path / "*_demo.hdf5"), ["robot_states"], "actions")
    assert len(demos) == 8 and {d[0] for d in demos} == {0, 1}
    chunks = Chunks(demos[:6], chunk=2)
    (x, y), (vx, vy) = chunks.samples(demos[:6]), chunks.samples(demos[6:])
    assert x.shape == (6 * 28, 2 + 2 * 3 + 2) and y.shape == (6 * 28, 2)
    w = fit_linear(x, y)
    assert rmse(torch.cat([vx, torch.ones(len(vx), 1)], 1) @ w, vy) < 1e-3
    assert rmse(torch.zeros_like(vy), vy) > 0.05
    net = fit_network(x, y, steps=5, batch=8, seed=0)
    errors = fed_back(net, chunks, demos[6:], horizon=3)
    assert len(errors) == 3 and all(np.isfinite(errors))
    with pytest.raises(SystemExit, match="no obs/joint_states"):
        load_demos(str(tmp_path / "*_demo.hdf5"), ["joint_states"], "actions")
    with pytest.raises(SystemExit, match="no files"):
        load_demos(str(tmp_path / "*.nothing"), ["robot_states"], "actions")
