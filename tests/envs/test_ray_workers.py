"""Env workers as Ray actors (``workers.backend=ray``) on a two-node Ray cluster of this host: a killed actor
replaced and its episode run again, and settings that cannot work as one line (RL on Ray actors, spread over both
nodes, against process workers: ``tests/rl/test_placement.py``)."""

from __future__ import annotations

import pytest

from ript.config import override
from ript.envs.runner import EnvRunner, RunnerOptions
from ript.envs.worker_env import PoolSettings
from ript.errors import RiptError
from ript.evaluation.results import summarize
from ript.model_loader import load_model
from ript.policies.build import make_policy, sampling_settings
from tests.helpers.cli import assert_one_line_error, ript
from tests.helpers.ray_cluster import kill_actor, two_node_cluster

# one test process runs this file's tests (pytest-xdist, --dist loadgroup), so its module fixture is built once
pytestmark = pytest.mark.xdist_group("test_ray_workers")


@pytest.fixture(scope="module")
def two_nodes():
    """A head and a second node, one CPU each; the jobs join it through ``workers.ray_address``."""
    with two_node_cluster(1) as address:
        yield address


def ray_settings(address: str) -> list[str]:
    return ["workers.backend=ray", override("workers.ray_address", address)]


def test_a_killed_env_actor_is_replaced_and_its_episode_run_again(two_nodes, stage1_run):
    model, config = load_model(stage1_run)
    render = config["metadata"]["env_args"]["render"]
    options = RunnerOptions("metaworld", model.task_names, render, 20, 2, num_workers=2,
                            pool=PoolSettings(60.0, 1, "ray", two_nodes))
    runner = EnvRunner(options)
    try:
        def evaluate():
            policy = make_policy(model, sampling_settings(config["metadata"], {"greedy": True}), "cpu", 0,
                                 cuda_graph=False)
            return runner.run(policy)

        undisturbed = summarize(evaluate())
        kill_actor(runner.workers.pool.actors[0])
        again = evaluate()
        assert again["worker_restarts"] == 1 and again["reruns"] >= 1
        assert summarize(again)["per_task"] == undisturbed["per_task"]
    finally:
        runner.close()


def test_more_actors_than_the_cluster_has_cpus_is_one_line(two_nodes, stage1_run):
    model, config = load_model(stage1_run)
    options = RunnerOptions("metaworld", model.task_names, config["metadata"]["env_args"]["render"], 5, 3,
                            num_workers=3, pool=PoolSettings(5.0, 0, "ray", two_nodes))
    runner = EnvRunner(options)
    policy = make_policy(model, sampling_settings(config["metadata"]), "cpu", 0, cuda_graph=False)
    with pytest.raises(RiptError, match=r"3 env worker\(s\) not started within workers.timeout_s=5 s"):
        runner.run(policy)
    runner.close()


def test_a_ray_address_with_no_cluster_is_one_line(stage1_run, tmp_path):
    result = ript("eval", f"checkpoint={stage1_run}", "episodes_per_task=1", "num_workers=1",
                  f"out_dir={tmp_path / 'eval'}", *ray_settings("127.0.0.1:1"))
    assert_one_line_error(result, "workers.ray_address=127.0.0.1:1", "no Ray head answers there")
    assert not (tmp_path / "eval" / "results.json").exists()
