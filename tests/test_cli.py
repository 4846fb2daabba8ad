"""Bad input through the real ``ript`` command: one line naming the file/key, exit code 2, nothing lost."""

import shutil

import h5py
import numpy as np
import pytest

from tests.helpers.cli import assert_one_line_error, ript, ript_here, task_overrides


def test_unknown_config_key_and_task():
    assert_one_line_error(ript_here("stage1", "algo.n_layers=4"), "algo.n_layers")
    assert_one_line_error(ript_here("collect", "task=metaworld_ml46"), "task/metaworld_ml46")
    assert_one_line_error(ript_here("collect", "task.task_names=[pick-plaec-v3]"), "pick-plaec-v3", "task.task_names")


def test_missing_dataset(tmp_path):
    assert_one_line_error(ript_here("stage0", f"task.data_dir={tmp_path}/nothing", f"run_dir={tmp_path}/run"),
                          "nothing/button-press-v3.hdf5", "does not exist")
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("damage", ["truncate", "nan", "action_dim"])
def test_damaged_dataset_files(tiny_data, tmp_path, damage):
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    path = data / "drawer-close-v3.hdf5"
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:20000])
        expected = ["drawer-close-v3.hdf5", "corrupt or truncated"]
    elif damage == "nan":
        with h5py.File(path, "a") as f:
            f["data/demo_2/actions"][5, 0] = np.nan
        expected = ["drawer-close-v3.hdf5:data/demo_2/actions", "NaN"]
    else:
        with h5py.File(path, "a") as f:
            del f["data/demo_0/actions"]
            f["data/demo_0/actions"] = np.zeros((len(f["data/demo_0/rewards"]), 7), dtype=np.float32)
        expected = ["data/demo_0/actions", "action dim 7"]
    overrides = [o for o in task_overrides(data)] + [f"run_dir={tmp_path}/run", "algo=quest_small"]
    assert_one_line_error(ript_here("stage0", *overrides), *expected)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_wrong_stage_checkpoint_for_eval_and_stage1(stage0_run, tiny_data, tmp_path):
    assert_one_line_error(ript_here("eval", f"checkpoint={stage0_run}"), "stage 'stage0'", "is needed")
    assert_one_line_error(ript_here("eval", f"checkpoint={tmp_path}/nope"), "nope does not exist")


def test_corrupt_weights_are_reported(stage1_run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(stage1_run / "checkpoints" / "last", copy)
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert_one_line_error(ript_here("eval", f"checkpoint={copy}"), "model.safetensors")


def test_help_lists_the_jobs():
    code, out, _ = ript("--help")
    assert code == 0
    for job in ("collect", "stage0", "stage1", "finetune", "eval", "quickstart"):
        assert job in out


def test_every_policy_family_composes_for_rl_and_eval_and_a_mismatch_is_one_line(tmp_path, stage1_run):
    from ript.config import compose
    from ript.policies.families import family_for
    from ript.registry import POLICIES

    assert POLICIES.names() == ["flow", "openvla", "openvla_oft", "pi0", "skill_prior"]
    for job in ("rl", "eval"):
        for name in POLICIES.names():
            cfg = compose(job, [f"policy={name}", "checkpoint=x", "task=libero_spatial"])
            assert cfg.policy.name == name and cfg.task.suite == "libero_spatial"
        assert type(family_for(compose(job, [f"checkpoint={stage1_run}"]))) is POLICIES.get("skill_prior")
    oft = compose("oft")  # the oft-* shorthands: RL's config with OpenVLA-OFT's keys and a LIBERO task
    assert oft.policy.name == "openvla_oft" and oft.task.suite == "libero_spatial" and "lora" in oft.policy
    assert_one_line_error(ript_here("eval", f"checkpoint={stage1_run}", "policy=openvla_oft", "task=libero_spatial"),
                          "holds the skill_prior policy family's model", "policy=skill_prior")


def test_collect_short_of_demos_leaves_no_final_file(tmp_path):
    # 30 steps are too few for the expert: no task file appears, so a rerun collects again rather than skipping
    result = ript("collect", f"task.data_dir={tmp_path}", "task.demos_per_task=1", "task.max_episode_steps=30",
                  "task.task_names=[button-press-v3]", "task.render.image_size=32")
    assert_one_line_error(result, "only 0 of 1", "button-press-v3", "task.max_episode_steps")
    assert not (tmp_path / "button-press-v3.hdf5").exists()


@pytest.mark.parametrize("env, words", [
    ({"MUJOCO_GL": "bogus"}, "MUJOCO_GL='bogus' is not a renderer"),
    ({"MUJOCO_GL": "egl", "MUJOCO_EGL_DEVICE_ID": "x"}, "MUJOCO_EGL_DEVICE_ID='x'")])
def test_a_misconfigured_renderer_is_one_line_before_any_simulator_starts(tmp_path, env, words):
    """MuJoCo would refuse these inside every worker, with a traceback from the pool."""
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "ript.cli", "collect", *task_overrides(tmp_path / "data"),
                           "num_workers=1"], capture_output=True, text=True, timeout=300, env={**os.environ, **env})
    assert_one_line_error((proc.returncode, proc.stdout, proc.stderr.strip().splitlines()), words)
    assert not list((tmp_path / "data").glob("*.hdf5"))
