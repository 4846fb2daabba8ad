"""``benchmarks/policy_on_imagined_frames.py``: the policy decides on real, imagined, closed-loop and still frames
with the same noise, so that only the frames make its chunks differ."""

from __future__ import annotations

import pytest
import torch

from benchmarks.policy_on_imagined_frames import STREAMS, load_policy, measure, streams_of
from ript.evaluation.imagination import demo_dataset
from ript.model_loader import load_model

# the fixtures are built once in the process that runs the world-model RL tests
pytestmark = pytest.mark.xdist_group("test_world_model_rl")


@pytest.mark.parametrize("policy_run", ["stage1_run", "flow_run"])
def test_the_streams_share_the_first_decision_and_part_where_their_frames_do(policy_run, world_model_run, request):
    model, config = load_model(world_model_run)
    loaded = load_policy(str(request.getfixturevalue(policy_run)), "cpu", 0)
    per_decision = loaded.policy.action_horizon // model.chunk
    data = demo_dataset(config, 3 * per_decision, "all")
    starts = data.episode_start.unique()[:4]
    torch.manual_seed(0)
    rows = measure(model, data, loaded.policy, starts, "cpu", batch_size=3)
    assert [r["decision"] for r in rows] == [0, 1, 2] and rows[0]["segments"] == 4
    first, later = rows[0], rows[1:]
    # one frame and one noise key for every stream: the same chunk, to the last bit
    streams = streams_of(model)
    assert len(model.image_keys) == 2 and streams[len(STREAMS):] == tuple(f"imagined_{k}" for k in model.image_keys)
    for name in streams[1:]:
        assert first[f"{name}_action_rmse"] == 0.0 and first[f"{name}_gripper_agreement"] == 1.0
    # the imagined cameras with the real state, and each camera imagined alone, move the policy's chunk
    assert any(r["imagined_cameras_action_rmse"] > 0 for r in later)
    assert any(r[f"imagined_{camera}_action_rmse"] > 0 for r in later for camera in model.image_keys)
    # the first frame held is not what the demos saw next, and a world model trained for a few steps is not either
    assert any(r["still_action_rmse"] > 0 for r in later)
    assert any(r["imagined_action_rmse"] > 0 for r in later) and any(r["closed_loop_state_rmse"] > 0 for r in later)
    assert all(r["imagined_psnr"] < first["imagined_psnr"] for r in later)
