"""Shared fixtures: one tiny real MetaWorld dataset (scripted experts, real HDF5) for the whole session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.cli import flow_overrides, stage1_overrides, task_overrides, train_overrides, world_model_overrides

os.environ.setdefault("MUJOCO_GL", "egl")
# one torch thread per test process and its children: two test processes share two cores with simulator workers,
# and OpenMP's spinning threads under that oversubscription made a 2 s test take 80 s
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_addoption(parser):
    parser.addoption("--extended", action="store_true",
                     help="also run the tests marked extended: the same multi-process machinery again for each "
                          "policy family, the update compiled on the CPU, and one test per scripted-expert behaviour")


def pytest_configure(config):
    config.addinivalue_line("markers", "extended: runs only with --extended (docs/testing.md says which and why)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--extended"):
        return
    deselected = [item for item in items if "extended" in item.keywords]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if "extended" not in item.keywords]


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    from ript.config import compose
    from ript.stages import collect

    data_dir = tmp_path_factory.mktemp("data")
    collect.run(compose("collect", task_overrides(data_dir) + ["episodes_per_job=2", "num_workers=2"]))
    return data_dir



@pytest.fixture(scope="session")
def stage0_run(tiny_data, tmp_path_factory) -> Path:
    from ript.config import compose
    from ript.stages import stage0

    run_dir = tmp_path_factory.mktemp("runs") / "stage0"
    stage0.run(compose("stage0", train_overrides(tiny_data, run_dir, 4)))
    return run_dir



@pytest.fixture(scope="session")
def stage1_run(tiny_data, stage0_run, tmp_path_factory) -> Path:
    from ript.config import compose
    from ript.stages import stage1

    run_dir = tmp_path_factory.mktemp("runs") / "stage1"
    stage1.run(compose("stage1", stage1_overrides(tiny_data, run_dir, stage0_run)))
    return run_dir



@pytest.fixture(scope="session")
def flow_run(tiny_data, tmp_path_factory) -> Path:
    """A small flow policy trained for a few steps on the tiny dataset (``ript flow``)."""
    from ript.config import compose
    from ript.stages import flow

    run_dir = tmp_path_factory.mktemp("runs") / "flow"
    flow.run(compose("flow", flow_overrides(tiny_data, run_dir, 4)))
    return run_dir



@pytest.fixture(scope="session")
def world_model_run(tiny_data, tmp_path_factory) -> Path:
    """A small world model trained for a few steps on the tiny dataset (``ript world-model``), two actions a step."""
    from ript.config import compose
    from ript.stages import world_model

    run_dir = tmp_path_factory.mktemp("runs") / "world_model"
    world_model.run(compose("world_model", world_model_overrides(tiny_data, run_dir, 20)))
    return run_dir

