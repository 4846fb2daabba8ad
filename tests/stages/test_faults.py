"""Faults a user meets: non-finite numbers, a full or read-only disk, env workers that die or hang."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.helpers.cli import assert_one_line_error, ript_here, stage1_overrides, train_overrides
from tests.helpers.faults import env_workers, fill_disk


def test_nan_weights_are_refused_on_load(stage1_run, tmp_path):
    import shutil

    copy = tmp_path / "run" / "checkpoints" / "0000004"
    shutil.copytree(stage1_run / "checkpoints" / "last", copy)
    state = load_file(str(copy / "model.safetensors"))
    name = next(k for k, v in state.items() if v.is_floating_point() and v.numel() > 1)
    state[name][0] = float("nan")
    save_file(state, str(copy / "model.safetensors"))
    assert_one_line_error(ript_here("eval", f"checkpoint={copy}", f"out_dir={tmp_path / 'out'}"), "model.safetensors",
                          repr(name), "NaN")
    assert not (tmp_path / "out").exists()


def test_nan_language_cache_is_refused(tiny_data, stage0_run, tmp_path):
    from ript.data.hdf5 import instruction_from_attrs, read_file_attrs
    from ript.data.language import embed_instructions

    cache = tmp_path / "lang.safetensors"
    path = tiny_data / "button-press-v3.hdf5"
    embed_instructions([instruction_from_attrs(read_file_attrs(path), path)], "minilm", cache)
    state = load_file(str(cache))
    state = {k: torch.full_like(v, float("nan")) for k, v in state.items()}
    save_file(state, str(cache))
    run = tmp_path / "run"
    assert_one_line_error(ript_here("stage1", *stage1_overrides(tiny_data, run, stage0_run),
                                    f"lang.cache_file={cache}"),
                          str(cache), "NaN", "delete")
    assert not run.exists()


def test_nan_loss_stops_training_and_keeps_the_last_good_checkpoint(tiny_data, tmp_path):
    run = tmp_path / "run"
    # a learning rate this large overflows the weights after the first update, so the second loss is NaN
    result = ript_here("stage0", *train_overrides(tiny_data, run, 6), "train.save_every=1", "train.lr=1e30",
                       "train.warmup_steps=0")
    assert_one_line_error(result, "non-finite training loss", "at step 2", "last good checkpoint")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["0000001", "last"]
    state = load_file(str(run / "checkpoints" / "last" / "model.safetensors"))
    assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())


@pytest.mark.parametrize("fused", [True, False])
def test_a_non_finite_step_changes_no_weights_and_the_check_names_it(fused):
    """Fused optimisers (CUDA) check finiteness on the device without stopping the host: from the bad step on
    the updates are skipped, and check() raises; others raise at the bad step itself."""
    from ript.utils.training import GuardedStep, NonFiniteLoss

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
    step = GuardedStep(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), 1.0)
    assert step.deferred == fused
    x = torch.randn(4, 3)
    for i in range(5):
        loss = model(x).pow(2).mean()
        if i == 2:
            good = {k: v.clone() for k, v in model.state_dict().items()}
            moments = [s["exp_avg"].clone() for s in opt.state.values()]
            loss = loss * float("nan")
        if i == 2 and not fused:
            with pytest.raises(NonFiniteLoss, match="at step 3"):
                step(loss, i)
            break
        step(loss, i)
        if i == 1:
            step.check()  # two good steps: nothing to report
    assert all(torch.equal(good[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(m, s["exp_avg"]) for m, s in zip(moments, opt.state.values()))
    assert [int(s["step"]) for s in opt.state.values()] == [2, 2]
    if fused:
        with pytest.raises(NonFiniteLoss, match="non-finite training loss nan .* at step 3; no update applied"):
            step.check()


def test_a_non_finite_model_is_never_written(tmp_path):
    from ript.errors import RiptError
    from ript.utils.checkpoint import save_checkpoint

    model = torch.nn.Linear(2, 2)
    save_checkpoint(tmp_path, 1, model, {})
    with torch.no_grad():
        model.weight[0, 0] = float("inf")
    with pytest.raises(RiptError, match="'weight' has NaN or inf"):
        save_checkpoint(tmp_path, 2, model, {})
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["0000001", "last"]


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real 32 MiB filesystem, to fill up or make read-only."""
    mount = tmp_path / "fs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_disk_full_while_saving_is_one_line_and_loses_nothing(stage0_run, tiny_data, small_tmpfs):
    import shutil

    run = small_tmpfs / "run"
    shutil.copytree(stage0_run, run, symlinks=True)
    fill_disk(small_tmpfs)
    before = {p.name for p in (run / "checkpoints").iterdir()}
    args = [*train_overrides(tiny_data, run, 6), "resume=true", "resume_allow_changes=[train.steps]"]
    assert_one_line_error(ript_here("stage0", *args), "no space left on the device")  # TensorBoard's first write
    assert_one_line_error(ript_here("stage0", *args, "logger.tensorboard=false"), "cannot write checkpoint",
                          "resume=true")
    assert {p.name for p in (run / "checkpoints").iterdir()} == before  # no partial folder, last untouched
    assert (run / "checkpoints" / "last" / "model.safetensors").is_file()


def test_read_only_run_folder_is_one_line(tiny_data, small_tmpfs):
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    assert_one_line_error(ript_here("stage0", *train_overrides(tiny_data, small_tmpfs / "run", 2)),
                          str(small_tmpfs / "run"), "read-only")


# a hung worker of one env; a dead worker of two (its reruns are those of every env it hosted)
@pytest.mark.parametrize("fault,envs_per_worker", [("stop", 1), pytest.param("kill", 2, marks=pytest.mark.extended)])
def test_eval_survives_a_worker_that_dies_or_hangs(stage1_run, tmp_path, fault, envs_per_worker):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "ript.cli", "eval", f"checkpoint={stage1_run}", f"out_dir={out}",
           "episodes_per_task=12", "num_workers=2", f"workers.envs_per_worker={envs_per_worker}",
           "max_episode_steps=120", "n_videos=0", "workers.timeout_s=10"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = env_workers(proc.pid, 2)[0]
    time.sleep(2.0)  # into its first episodes (the whole run takes ~7 s: 24 episodes of up to 120 steps)
    os.kill(victim, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert "replacing it" in err
    results = json.loads((out / "results.json").read_text())
    # every episode the dead worker was running (one per env it hosted, fewer if one had just ended) runs again
    assert len(results["episodes"]) == 24 and results["worker_restarts"] == 1
    assert 1 <= results["reruns"] <= envs_per_worker
    assert sorted((e["task"], e["episode"]) for e in results["episodes"]) == sorted(
        (t, j) for t in results["per_task"] for j in range(12))
    if fault == "stop":
        with pytest.raises(ProcessLookupError):
            os.kill(victim, 0)  # the hung worker was killed, not left stopped


def test_eval_fails_with_one_line_past_the_restart_limit(stage1_run, tmp_path):
    cmd = [sys.executable, "-m", "ript.cli", "eval", f"checkpoint={stage1_run}", f"out_dir={tmp_path / 'out'}",
           "episodes_per_task=4", "num_workers=1", "max_episode_steps=120", "n_videos=0", "workers.max_restarts=0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    os.kill(env_workers(proc.pid, 1)[0], signal.SIGKILL)
    _, err = proc.communicate(timeout=240)
    assert_one_line_error((proc.returncode, "", err.strip().splitlines()), "env worker 0 died",
                          "workers.max_restarts=0")
    assert not (tmp_path / "out" / "results.json").exists()
