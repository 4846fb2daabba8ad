"""A job that runs other jobs ends with them: a SIGTERM to ``ript protocol`` reaches its running phase, the protocol
ends after it, and the same command continues."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from ript.config import override
from tests.helpers.cli import task_overrides
from tests.helpers.faults import processes

TRAIN = "steps: 4, batch_size: 16, warmup_steps: 2, val_every: 2, save_every: 2, log_every: 1"


def test_sigterm_to_a_protocol_ends_its_running_phase_and_the_same_command_continues(tiny_data, tmp_path):
    # the phase went on training with PPID 1, and a rerun started a second writer of its folder beside it
    root = tmp_path / "protocol"
    command = [sys.executable, "-m", "ript.cli", "protocol", "ml45_multitask", *task_overrides(tiny_data),
               "algo=quest_small", f"run_root={root}", "gpus=1", "phases.stage1=null", "phases.eval=null",
               "phases.rl=null", "phases.eval_rl=null", "++phases.collect={num_workers: 1}",
               f"++phases.stage0={{progress: false, train: {{{TRAIN}}}, data: {{val_fraction: 0.34}}}}"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline, phase = time.time() + 120, []
        while time.time() < deadline and not phase:
            assert proc.poll() is None, proc.communicate()
            # the job's own argument: a child forked for the collect phase shows the protocol's command line (which
            # holds "++phases.stage0=...") until it execs
            phase = [p["pid"] for p in processes()
                     if p["ppid"] == proc.pid and b"\x00ript.cli\x00stage0\x00" in p["cmdline"]]
            time.sleep(0.05)
        assert phase, "the stage0 phase did not start"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "the same command continues from this phase" in err, err
    left = [p for p in processes() if p["pid"] == phase[0] or p["ppid"] in (proc.pid, phase[0])]
    assert not left, left  # the phase (and anything it started) ended before the protocol did

    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "phase collect finished earlier" in again.stderr
    assert (root / "stage0" / "checkpoints" / "last").resolve().name == "0000004"


def test_an_interrupted_quickstart_continues_where_it_stopped(tiny_data, tmp_path):
    # Ctrl-C said "resume with resume=true", which quickstart does not take; the same command then failed with
    # "run_dir ... already exists"
    root = tmp_path / "quickstart ö"  # any characters in the run root
    command = [sys.executable, "-m", "ript.cli", "quickstart", *task_overrides(tiny_data), override("run_root", root),
               "stage0.steps=4", "stage0.batch_size=16", "stage1.steps=4", "stage1.batch_size=16", "eval_episodes=1"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.time() + 180
        while time.time() < deadline and not (root / "stage1" / "config.json").exists():
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)  # Ctrl-C in stage 1, stage 0 finished
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "the same command continues where it stopped" in err, err
    assert "resume=true" not in err.splitlines()[-1]

    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert (root / "eval" / "results.json").is_file()
    for stage in ("stage0", "stage1"):
        assert (root / stage / "checkpoints" / "last").resolve().name == "0000004"


def test_a_job_stopped_past_its_time_limit_or_aborted_prints_its_stacks():
    # a run that waits with no sign of where: ``ript`` prints every thread's stack on SIGUSR1
    from ript.utils.processes import run_with_time_limit

    waits = ("import sys, time; import ript.cli as cli; "
             "cli.app.command(name='wait_here')(lambda: time.sleep(120)); sys.argv = ['ript', 'wait_here']; cli.main()")
    t0 = time.time()
    code, _, err = run_with_time_limit([sys.executable, "-c", waits], limit_s=8)
    assert code is None
    assert "most recent call first" in err and "<lambda>" in err, err
    assert time.time() - t0 < 60
    code, out, _ = run_with_time_limit([sys.executable, "-c", "print('done')"], limit_s=60)
    assert (code, out.strip()) == (0, "done")
    # a job a fatal signal ends (a native crash, NCCL's watchdog aborting a rank) says where it was too
    aborts = waits.replace("lambda: time.sleep(120)", "lambda: os.abort()").replace("import sys,", "import os, sys,")
    code, _, err = run_with_time_limit([sys.executable, "-c", aborts], limit_s=120)
    assert code == -signal.SIGABRT and "Fatal Python error: Aborted" in err and "<lambda>" in err, err


def test_a_rank_torchrun_stops_after_another_failed_prints_where_it_waited():
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
               "tests.helpers.rank_stops"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "most recent call first" in proc.stderr and "waiting_for_nothing" in proc.stderr, proc.stderr[-3000:]
