"""What the tests share: running the ript command, its one-line errors, and tiny-size overrides."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ript.config import override

TASKS = ["button-press-v3", "drawer-close-v3"]


def ript(*args, cwd=None):
    proc = subprocess.run([sys.executable, "-m", "ript.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)
    return proc.returncode, proc.stdout, proc.stderr.strip().splitlines()


def ript_here(*args):
    """The ``ript`` command run in this process, for checks of a job's one-line error: the same exit code and the
    same lines on stderr as ``ript()`` (the logger writes to whatever stderr is), without a new interpreter's
    imports. What a job may set for its process is put back, and every folder lock this process holds is let go
    afterwards, as the end of a ``ript`` process would let go of its own."""
    import os
    import threading

    import torch
    from typer.testing import CliRunner

    from ript.cli import app
    from ript.utils.locking import release_all

    environ, excepthook = dict(os.environ), threading.excepthook
    deterministic, threads = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
    try:
        result = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
    finally:
        os.environ.clear()
        os.environ.update(environ)
        threading.excepthook = excepthook
        torch.use_deterministic_algorithms(deterministic)
        torch.set_num_threads(threads)
        release_all()
    return result.exit_code, result.stdout, result.stderr.strip().splitlines()


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
        override("task.data_dir", data_dir),
        "task.demos_per_task=3",
        "task.render.image_size=32",
        "task.max_episode_steps=120",
    ]


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


def stage1_overrides(data_dir: Path, run_dir: Path, stage0_run: Path) -> list[str]:
    """Four steps with an evaluation in the simulator after steps 2 and 4."""
    return train_overrides(data_dir, run_dir, 4) + [
        f"stage0_checkpoint={stage0_run}", "eval.every=2", "eval.episodes_per_task=1", "eval.num_workers=1",
        "eval.max_episode_steps=16", "eval.n_videos=0"]


def flow_overrides(data_dir: Path, run_dir: Path, steps: int) -> list[str]:
    """A small flow policy trained for ``steps`` steps, replanning every 4 of its 8 actions."""
    return [*(o for o in train_overrides(data_dir, run_dir, steps) if not o.startswith("algo=")), "algo=flow_small"]


def world_model_overrides(data_dir: Path, run_dir: Path, steps: int) -> list[str]:
    """A small world model trained for ``steps`` steps, two actions per prediction."""
    return [*(o for o in train_overrides(data_dir, run_dir, steps) if not o.startswith("algo=")),
            "algo=world_model_small", "algo.chunk=2"]


def flow_rl_overrides(flow_run, run_dir, iterations: int, *extra: str) -> list[str]:
    return [f"checkpoint={flow_run}", "policy=flow", f"run_dir={run_dir}", f"rl.iterations={iterations}",
            "task_names=[drawer-close-v3]", "rl.groups_per_iteration=2", "rl.rollouts_per_group=2",
            "rl.max_episode_steps=24", "rl.num_workers=2", "rl.max_sampling_rounds=1", "rl.epochs=2",
            "rl.minibatches=2", "rl.lr=1e-3", "eval.every=0", "rl.reward=dense", "rl.reward_scale=0.1", *extra]


def pi0_rl_overrides(folder, run_dir, iterations: int, *extra: str) -> list[str]:
    return [f"checkpoint={folder}", "policy=pi0", "task=metaworld_quick", "task.render.image_size=32",
            "policy.image_keys=[corner_rgb]", "policy.state_keys=[robot_states]", "policy.delta_dims=0",
            "policy.action_horizon=4", "policy.denoise_steps=2", f"run_dir={run_dir}", f"rl.iterations={iterations}",
            "task_names=[drawer-close-v3]", "rl.groups_per_iteration=1", "rl.rollouts_per_group=2",
            "rl.max_episode_steps=12", "rl.num_workers=1", "rl.max_sampling_rounds=1", "rl.epochs=1",
            "rl.minibatches=1", "rl.lr=1e-3", "eval.every=0", "rl.reward=dense", "rl.reward_scale=0.1",
            "rl.advantage=gae", *extra]


def oft_rl_overrides(folder, run_dir, iterations: int, *extra: str) -> list[str]:
    """``ript rl`` of the tiny MetaWorld OpenVLA-OFT folder: LoRA with its heads, a critic and dense rewards."""
    return [f"checkpoint={folder}", "policy=openvla_oft", "task=metaworld_ml45", "task.task_names=[reach-v3]",
            "task.render.image_size=32", "task.render.cameras=[corner]", "policy.image_keys=[corner_rgb]",
            "policy.proprio_keys=[robot_states]", "policy.gripper=none", "policy.center_crop=false",
            "policy.init_scale=0.5", f"run_dir={run_dir}", f"rl.iterations={iterations}", "rl.groups_per_iteration=2",
            "rl.rollouts_per_group=2", "rl.max_sampling_rounds=1", "rl.max_episode_steps=16", "rl.num_workers=1",
            "rl.epochs=2", "rl.minibatches=2", "rl.micro_batch=2", "rl.advantage=gae", "rl.reward=dense",
            "eval.every=0", *extra]


def rl_overrides(stage1_run, run_dir, iterations):
    return [f"checkpoint={stage1_run}", f"run_dir={run_dir}", f"rl.iterations={iterations}",
            "task_names=[drawer-close-v3]", "rl.groups_per_iteration=2", "rl.rollouts_per_group=2",
            "rl.max_episode_steps=36", "rl.num_workers=2", "rl.max_sampling_rounds=2", "rl.epochs=2",
            "rl.minibatches=2", "rl.lr=1e-3", "eval.every=0", "sampling.temperature=3.0"]


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

            def compare(path, obj, name=name, seen=seen):
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


def first_scalar(run_dir: Path, tag: str) -> float:
    """The first value a run logged to TensorBoard under ``tag``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    return events.Scalars(tag)[0].value
