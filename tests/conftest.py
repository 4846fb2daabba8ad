"""Shared fixtures: one tiny real MetaWorld dataset (scripted experts, real HDF5) for the whole session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("MUJOCO_GL", "egl")

TASKS = ["button-press-v3", "drawer-close-v3"]


def ript(*args, cwd=None):
    proc = subprocess.run([sys.executable, "-m", "ript.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)
    return proc.returncode, proc.stdout, proc.stderr.strip().splitlines()


def assert_one_line_error(result, *fragments):
    code, _, err = result
    assert code == 2, err
    errors = [line for line in err if line.startswith("error: ")]
    assert len(errors) == 1, err
    assert not any(line.startswith("Traceback") for line in err), err
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def task_overrides(data_dir: Path) -> list[str]:
    """Two tasks, three demos each, 32-pixel images."""
    return [
        "task=metaworld_quick",
        f"task.data_dir={data_dir}",
        "task.demos_per_task=3",
        "task.render.image_size=32",
        "task.max_episode_steps=120",
    ]


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    from ript.config import compose
    from ript.stages import collect

    data_dir = tmp_path_factory.mktemp("data")
    collect.run(compose("collect", task_overrides(data_dir) + ["episodes_per_job=2", "num_workers=2"]))
    return data_dir


def train_overrides(data_dir: Path, run_dir: Path, steps: int) -> list[str]:
    """Config overrides that make a training stage run in seconds on a CPU."""
    return task_overrides(data_dir) + [
        "algo=quest_small",
        "progress=false",
        f"run_dir={run_dir}",
        f"train.steps={steps}",
        "train.batch_size=16",
        "train.warmup_steps=2",
        "train.log_every=1",
        "train.val_every=2",
        "train.save_every=2",
        "data.val_fraction=0.34",
    ]


@pytest.fixture(scope="session")
def stage0_run(tiny_data, tmp_path_factory) -> Path:
    from ript.config import compose
    from ript.stages import stage0

    run_dir = tmp_path_factory.mktemp("runs") / "stage0"
    stage0.run(compose("stage0", train_overrides(tiny_data, run_dir, 4)))
    return run_dir


def stage1_overrides(data_dir: Path, run_dir: Path, stage0_run: Path) -> list[str]:
    """Four steps with an evaluation in the simulator after steps 2 and 4."""
    return train_overrides(data_dir, run_dir, 4) + [
        f"stage0_checkpoint={stage0_run}", "eval.every=2", "eval.episodes_per_task=1", "eval.num_workers=1",
        "eval.max_episode_steps=16", "eval.n_videos=0"]


@pytest.fixture(scope="session")
def stage1_run(tiny_data, stage0_run, tmp_path_factory) -> Path:
    from ript.config import compose
    from ript.stages import stage1

    run_dir = tmp_path_factory.mktemp("runs") / "stage1"
    stage1.run(compose("stage1", stage1_overrides(tiny_data, run_dir, stage0_run)))
    return run_dir


def assert_round_trip(original: Path, back: Path, mean_image_error: float) -> None:
    """Two demonstration files hold the same demos: every dataset with its shape and dtype, bit-identical except
    images (mean absolute error per frame below ``mean_image_error`` levels of 255), and the same attributes."""
    import h5py
    import numpy as np

    with h5py.File(original, "r") as fa, h5py.File(back, "r") as fb:
        a, b = fa["data"], fb["data"]
        assert sorted(a) == sorted(b)
        assert sorted(a.attrs) == sorted(b.attrs)
        for name in a:
            seen = []

            def compare(path, obj):
                if not isinstance(obj, h5py.Dataset):
                    return
                x, y = obj[()], b[name][path][()]
                assert (x.shape, x.dtype) == (y.shape, y.dtype), path
                if x.dtype == np.uint8 and x.ndim == 4:
                    error = np.abs(x.astype(np.int16) - y.astype(np.int16)).mean(axis=(1, 2, 3))
                    assert error.max() < mean_image_error, (path, error.max())
                else:
                    assert np.array_equal(x, y), path
                seen.append(path)

            a[name].visititems(compare)
            assert "actions" in seen and any(p.startswith("obs/") for p in seen)
            assert {k: v for k, v in a[name].attrs.items()} == {k: v for k, v in b[name].attrs.items()}


def drive_scripted_demo(suite: str, task_name: str, demo: int, limit: int, check=None) -> tuple[bool, int]:
    """Run the expert of a LIBERO task on one demo's layout with that demo's action noise (as ``ript collect`` and
    ``benchmarks.libero_experts`` draw them, seed 0) until the task is done or ``limit`` steps; ``check(task, expert,
    step)`` is called before every step. Returns (success, steps)."""
    import numpy as np

    from ript.envs.libero import LiberoTask
    from ript.envs.seeds import demo_layout_seed, demo_noise_rng
    from ript.experts.libero.goals import make_expert

    task = LiberoTask(suite, task_name, None)
    try:
        task.reset(demo_layout_seed(0, demo, 0), render=False)
        expert, rng, steps = make_expert(task), demo_noise_rng(0, task_name, demo, 0), 0
        while not task.done and steps < limit:
            if check is not None:
                check(task, expert, steps)
            action = expert.get_action(task)
            action[:6] = np.clip(action[:6] + rng.normal(0.0, 0.05, 6), -1.0, 1.0)
            task.step(action, render=False)
            steps += 1
        return bool(task.success), steps
    finally:
        task.close()


def scripted_libero_episode(suite: str, task_name: str, demo: int | None = None):
    """(the expert a LIBERO task gets at layout 0, one scripted demo of it there with noise 0.05), on the real
    simulator; with ``demo``, the layout and noise of that demo as ``ript collect`` and
    ``benchmarks.libero_experts`` draw them (seed 0) instead."""
    import numpy as np

    from ript.envs.libero import LiberoTask
    from ript.envs.seeds import demo_layout_seed, demo_noise_rng
    from ript.experts.libero.episode import run_episode
    from ript.experts.libero.goals import make_expert

    layout, rng = 0, np.random.default_rng(0)
    if demo is not None:
        layout, rng = demo_layout_seed(0, demo, 0), demo_noise_rng(0, task_name, demo, 0)
    task = LiberoTask(suite, task_name, None)
    try:
        task.reset(layout, render=False)
        expert = make_expert(task)
        return expert, run_episode(task, layout, rng, 0.05, render=False)
    finally:
        task.close()
