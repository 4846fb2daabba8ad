"""One writer per folder: a held folder refuses a second writer in one line naming the holder; a killed holder's
lock is taken over; two real ``ript`` processes on one run folder."""

from __future__ import annotations

import json
import logging
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ript.errors import RiptError
from ript.utils.locking import LOCK_FILE, hold_folder, holding, release
from tests.helpers.cli import assert_one_line_error, ript_here, train_overrides

HOLD = "import sys, time; from ript.utils.locking import hold_folder; hold_folder(sys.argv[1], 'run_dir'); " \
       "print('held', flush=True); time.sleep(60)"


def wait_for_lock(folder: Path, pid: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until ``pid`` holds ``folder``'s lock (its lock file names it)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            if json.loads((folder / LOCK_FILE).read_text()).get("pid") == pid:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"{pid} did not take {folder}'s lock in {timeout:.0f} s")


def test_a_held_folder_refuses_a_second_writer_and_a_killed_holders_lock_is_taken_over(tmp_path, caplog):
    folder = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RiptError, match=rf"{folder} is being written by PID {holder.pid} on .*since"):
            hold_folder(folder, "run_dir")
    finally:
        holder.kill()  # as kill -9: its lock file stays, naming a process that is gone
        holder.wait()
    assert json.loads((folder / LOCK_FILE).read_text())["pid"] == holder.pid
    ript_log = logging.getLogger("ript")  # the console set-up of earlier jobs in this process stops propagation
    ript_log.addHandler(caplog.handler)
    try:
        with caplog.at_level("INFO", logger="ript"), holding(folder, "run_dir"):
            assert json.loads((folder / LOCK_FILE).read_text())["pid"] != holder.pid
    finally:
        ript_log.removeHandler(caplog.handler)
    assert f"taking over the lock left by PID {holder.pid}" in caplog.text
    assert not (folder / LOCK_FILE).exists()  # released cleanly: nothing left behind


def test_an_output_folder_that_cannot_be_written_fails_before_any_work(tmp_path):
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(RiptError, match="out_dir .*file is a file, not a folder; choose another out_dir"):
        hold_folder(file, "out_dir")
    with pytest.raises(RiptError, match="cannot write out_dir .*file/sub"):
        hold_folder(file / "sub", "out_dir")
    hold_folder(tmp_path / "fine", "out_dir")
    hold_folder(tmp_path / "fine", "out_dir")  # a folder this process holds already: nothing to do
    release(tmp_path / "fine")


def test_two_stage0_resumes_of_one_run_folder_the_second_ends_in_one_line(tiny_data, stage0_run, tmp_path):
    # both exited 0 and replaced each other's checkpoints
    run = tmp_path / "run"
    shutil.copytree(stage0_run, run, symlinks=True)
    recorded = json.loads((run / "config.json").read_text())
    # the first trains until stopped, so it still holds the folder however slowly the second starts
    periodic = ("train.save_every", "train.val_every")
    long_run = [o for o in train_overrides(tiny_data, run, 10**6) if not o.startswith(periodic)]
    args = [sys.executable, "-m", "ript.cli", "stage0", *long_run, "train.save_every=1000", "train.val_every=1000",
            "resume=true", "resume_allow_changes=[train.steps]"]
    first = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_lock(run, first.pid, first)
        second = subprocess.run([*args, "train.lr=1e-2", "resume_allow_changes=[train.steps,train.lr]"],
                                capture_output=True, text=True, timeout=300)
        errors = [line for line in second.stderr.splitlines() if line.startswith("error: ")]
        assert second.returncode == 2 and len(errors) == 1, second.stderr
        assert f"{run} is being written by PID {first.pid}" in errors[0] and "ript stage0" in errors[0], errors[0]
        assert first.poll() is None, first.stderr.read()
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=300) == 130, first.stderr.read()
    finally:
        first.kill()
    assert json.loads((run / "config.json").read_text())["train"]["lr"] == recorded["train"]["lr"]
    assert not (run / LOCK_FILE).exists()


def test_an_output_location_that_is_a_file_fails_before_the_first_episode_or_phase(stage1_run, tmp_path):
    # eval ran every episode, then failed, keeping nothing
    file = tmp_path / "results"
    file.write_text("mine")
    t0 = time.perf_counter()
    assert_one_line_error(ript_here("eval", f"checkpoint={stage1_run}", f"out_dir={file}", "episodes_per_task=50"),
                          f"out_dir {file} is a file", "choose another out_dir")
    assert time.perf_counter() - t0 < 60 and file.read_text() == "mine"
    assert_one_line_error(ript_here("protocol", "ml45_multitask", f"run_root={file}"), f"run_root {file} is a file")
    assert file.read_text() == "mine"
