"""The runner's schedule changes no episode: episodes that end at different times (a drawer pushed shut within
~20 steps, a button never pressed) give the same steps, successes and frame stacks whether each env has a worker
of its own or envs share a worker, whose idle slots start their next episodes while its other envs run on."""

import numpy as np
import pytest

from ript.envs.runner import EnvRunner, RunnerOptions
from ript.envs.worker_env import EpisodeSpec
from tests.helpers.policies import NoisyHold

RENDER = {"cameras": ["corner"], "image_size": 32, "quality": "low"}
TASKS = ["drawer-close-v3", "button-press-v3"]
PUSH = np.array([0.0, 1.0, -0.5, 0.0], dtype=np.float32)  # forward and down: shuts MetaWorld's drawer


def run(workers: int, per_worker: int, specs: list[EpisodeSpec]) -> dict:
    policy = NoisyHold(seed=5, action_horizon=3, frame_stack=1, noise=0.1, pushes={TASKS[0]: PUSH})
    policy.start_recording()
    runner = EnvRunner(RunnerOptions("metaworld", TASKS, RENDER, 30, 1, num_workers=workers,
                                     envs_per_worker=per_worker, pipeline_stages=1))
    try:
        return runner.run(policy, specs=specs)
    finally:
        runner.close()


def test_episodes_started_beside_running_ones_match_each_env_alone():
    specs = [EpisodeSpec(TASKS[j % 2], 3 + j // 2, j) for j in range(6)]
    alone = run(6, 1, specs)
    shared = run(1, 2, specs)
    by_index = [sorted(r["episodes"], key=lambda e: e["episode"]) for r in (alone, shared)]
    lengths = [e["length"] for e in by_index[0]]
    assert min(lengths) < 30 == max(lengths)  # the episodes really end at different times
    for a, b in zip(*by_index):
        assert (a["task"], a["seed"], a["success"], a["length"]) == (b["task"], b["seed"], b["success"], b["length"])
        assert len(a["decisions"]) == len(b["decisions"])
        for x, y in zip(a["decisions"], b["decisions"]):
            np.testing.assert_array_equal(x["stack"], y["stack"])
    assert shared["env_steps"] == alone["env_steps"] == sum(lengths)
    assert shared["decision_rounds"] < sum(len(e["decisions"]) for e in by_index[1])  # envs planned together
    assert shared["slot_occupancy"] == pytest.approx(shared["decisions"] / (2 * shared["decision_rounds"]))
