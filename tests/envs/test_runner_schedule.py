"""The runner's schedule changes no episode: episodes that end at different times (a drawer pushed shut within
~20 steps, a button never pressed) give the same steps, successes and frame stacks whether each env has a worker
of its own or envs share a worker, whose idle slots start their next episodes while its other envs run on; and
whether a slot keeps every task it built or closes them to stay within its bound."""

import numpy as np
import pytest

from ript.envs.runner import EnvRunner, RunnerOptions
from ript.envs.suites import get_suite
from ript.envs.worker_env import EpisodeSpec, PoolSettings, slot_task_limit
from tests.helpers.policies import NoisyHold

RENDER = {"cameras": ["corner"], "image_size": 32, "quality": "low"}
TASKS = ["drawer-close-v3", "button-press-v3"]
PUSH = np.array([0.0, 1.0, -0.5, 0.0], dtype=np.float32)  # forward and down: shuts MetaWorld's drawer


def run(workers: int, per_worker: int, specs: list[EpisodeSpec], tasks_per_slot: int | str = "auto",
        built: list | None = None) -> dict:
    policy = NoisyHold(seed=5, action_horizon=3, frame_stack=1, noise=0.1, pushes={TASKS[0]: PUSH})
    policy.start_recording()
    runner = EnvRunner(RunnerOptions("metaworld", sorted({s.task_name for s in specs}), RENDER, 30, 1,
                                     num_workers=workers, envs_per_worker=per_worker, pipeline_stages=1,
                                     pool=PoolSettings(tasks_per_slot=tasks_per_slot)))
    try:
        results = runner.run(policy, specs=specs)
        if built is not None:
            built.extend(runner.slot_scenes)  # MetaWorld: each task its own scene
        return results
    finally:
        runner.close()


def same_episodes(first: dict, second: dict) -> None:
    """The two runs' episodes, by index, have the same outcomes and lengths, and every decision the same frames."""
    for a, b in zip(*[sorted(r["episodes"], key=lambda e: e["episode"]) for r in (first, second)], strict=True):
        assert (a["task"], a["seed"], a["success"], a["length"]) == (b["task"], b["seed"], b["success"], b["length"])
        for x, y in zip(a["decisions"], b["decisions"], strict=True):
            np.testing.assert_array_equal(x["stack"], y["stack"])


def test_episodes_started_beside_running_ones_match_each_env_alone():
    specs = [EpisodeSpec(TASKS[j % 2], 3 + j // 2, j) for j in range(6)]
    alone = run(6, 1, specs)
    shared = run(1, 2, specs)
    by_index = [sorted(r["episodes"], key=lambda e: e["episode"]) for r in (alone, shared)]
    lengths = [e["length"] for e in by_index[0]]
    assert min(lengths) < 30 == max(lengths)  # the episodes really end at different times
    same_episodes(alone, shared)
    assert shared["env_steps"] == alone["env_steps"] == sum(lengths)
    assert shared["decision_rounds"] < sum(len(e["decisions"]) for e in by_index[1])  # envs planned together
    assert shared["slot_occupancy"] == pytest.approx(shared["decisions"] / (2 * shared["decision_rounds"]))


def test_a_slot_bounded_to_one_built_task_closes_the_others_and_gives_the_same_episodes():
    tasks = TASKS + ["reach-v3"]
    specs = [EpisodeSpec(tasks[j % 3], 3, j) for j in range(6)]  # one slot meets each of three tasks
    kept_all, kept_one = [], []
    unbounded = run(1, 1, specs, "auto", kept_all)
    bounded = run(1, 1, specs, 1, kept_one)
    same_episodes(unbounded, bounded)
    assert sorted(kept_all[0]) == sorted(tasks) and len(kept_one[0]) == 1


def test_the_automatic_bound_shares_half_the_memory_over_every_slot_of_the_host():
    gib = 2**30
    assert slot_task_limit("auto", 800, 16, 110 * gib) == 4           # 55 GiB over 16 LIBERO scenes of 0.78 GiB
    assert slot_task_limit("auto", 800, 16, 110 * gib, processes=2) == 2  # two torchrun ranks, 16 slots each
    assert slot_task_limit("auto", 150, 64, 4 * gib) == 1              # never below one
    assert slot_task_limit(3, 800, 16, 1) == 3                        # a number is kept as given
    # two torchrun ranks of 64 MetaWorld slots on a host of 244 GiB available: rendering on the GPUs, each slot
    # keeps the ten tasks of a ten-task protocol; in software, whose buffers are in host memory, six
    metaworld = get_suite("metaworld")
    assert slot_task_limit("auto", metaworld.built_task_mib(True), 64, 244 * gib, processes=2) == 10
    assert slot_task_limit("auto", metaworld.built_task_mib(False), 64, 244 * gib, processes=2) == 6
    assert get_suite("libero_10").built_task_mib(True) == get_suite("libero_10").built_task_mib(False)
