"""The policy interface pinned: a third policy family, written only against ``ript/policies/base.py``, runs
through the env runner (frame stacks, whole chunks, recording) like the QueST and OpenVLA-OFT policies."""

import numpy as np
import torch

from conftest import TASKS
from ript.envs.runner import EnvRunner, EpisodeSpec
from ript.policies.base import ChunkingPolicy

RENDER = {"cameras": ["corner"], "image_size": 32, "quality": "low"}


class NoisyHold(ChunkingPolicy):
    """Small seeded random motions; records the frame stack each decision read."""

    def __init__(self, seed: int = 0):
        super().__init__(action_dim=4, action_horizon=5, frame_stack=2, device="cpu", seed=seed,
                         obs_keys=["robot_states"])

    def reset(self, n_envs: int) -> None:
        super().reset(n_envs)
        self.tasks = [""] * n_envs

    def start_task(self, i: int, task_name: str) -> None:
        self.tasks[i] = task_name

    def plan(self, envs: list[int]) -> np.ndarray:
        noise = torch.randn(len(envs), self.action_horizon, self.action_dim, generator=self.generator)
        if self.record:
            for i in envs:
                self.records[i].append({"task": self.tasks[i],
                                        "stack": np.stack([f["robot_states"] for f in self.history[i]])})
        return (0.2 * noise).clamp(-1, 1).numpy()


def test_a_third_policy_runs_through_the_runner():
    specs = [EpisodeSpec(TASKS[j % 2], 7 + j, j) for j in range(3)]
    outs = []
    for _ in range(2):  # seeded: the same policy seed gives the same episodes
        policy = NoisyHold(seed=3)
        policy.record = True
        runner = EnvRunner("metaworld", TASKS, RENDER, 12, 1, num_workers=2)
        try:
            outs.append(runner.run(policy, specs=specs))
        finally:
            runner.close()
    episodes = sorted(outs[0]["episodes"], key=lambda e: e["episode"])
    assert [e["length"] for e in episodes] == [12, 12, 12] and outs[0]["env_steps"] == 36
    for e in episodes:
        assert len(e["decisions"]) == 3  # ceil(12 / 5)
        assert all(d["task"] == e["task"] and d["stack"].shape == (2, 4) for d in e["decisions"])
        first = e["decisions"][0]["stack"]
        assert np.array_equal(first[0], first[1])  # an episode's first stack is padded with its first frame
        assert not np.array_equal(e["decisions"][1]["stack"][0], e["decisions"][1]["stack"][1])  # the arm moved
    assert policy.inference_seconds > 0
    again = sorted(outs[1]["episodes"], key=lambda e: e["episode"])
    assert all(np.array_equal(a["stack"], b["stack"])
               for x, y in zip(episodes, again) for a, b in zip(x["decisions"], y["decisions"]))
