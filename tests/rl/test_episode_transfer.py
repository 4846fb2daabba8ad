"""A round's recorded episodes packed for the trip from a rollout actor to its trainer come back as the same
decisions, bit for bit, as a handful of tensors rather than several per decision."""

from __future__ import annotations

import pickle

import torch

from ript.rl.episode_transfer import pack_episodes, unpack_episodes


def recorded_episode(n: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    decisions = [{"context": torch.randn(4, 8, generator=g), "tokens": torch.randint(0, 9, (5,), generator=g),
                  "log_probs": torch.randn(5, generator=g).to(torch.bfloat16), "value": torch.randn((), generator=g),
                  "obs": {"agentview_rgb": torch.randint(0, 255, (2, 3, 6, 6), dtype=torch.uint8, generator=g)},
                  "task_id": i % 3, "prompt": f"open the drawer {i}", "proprio": None} for i in range(n)]
    if decisions:
        decisions[-1]["bootstrap_value"] = torch.tensor(0.5)
    return {"task": "drawer-open-v3", "episode": seed, "seed": seed, "success": bool(seed % 2), "length": 2 * n,
            "decisions": decisions, "chunk_rewards": [0.0] * n}


def assert_same(a, b) -> None:
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


def tensors_in(tree) -> int:
    if isinstance(tree, torch.Tensor):
        return 1
    if isinstance(tree, dict):
        return sum(tensors_in(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(tensors_in(v) for v in tree)
    return 0


def test_packed_episodes_unpack_to_the_same_decisions_in_a_few_tensors():
    results = {"episodes": [recorded_episode(n, seed) for seed, n in enumerate([30, 1, 0, 12])],
               "env_steps": 86, "first_frames": {"drawer-open-v3": None}}
    results["episodes"].append({"task": "reach-v3", "episode": 9, "seed": 9, "success": True, "length": 3})
    packed = pickle.loads(pickle.dumps(pack_episodes(results)))  # as Ray would carry it
    assert_same(unpack_episodes(packed, "cpu"), results)
    # one stacked tensor per field and episode (context, tokens, log-probs, value, one camera) plus the last
    # decisions' bootstrap values, against five per decision
    assert tensors_in(packed) == 3 * 5 + 3 < tensors_in(results) == 43 * 5 + 3
