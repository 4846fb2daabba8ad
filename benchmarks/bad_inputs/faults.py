"""Cases of runs and faults: non-finite losses, resumes, folders in the way, a full or read-only disk, env
workers killed or hung, two writers of one folder, a protocol stopped, a merge on a full disk."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py

from benchmarks.bad_inputs.matrix import EVAL, TASK, TRAIN, Matrix, mount_tmpfs, ript
from tests.helpers.faults import env_workers, fill_disk, processes


def run_cases(m: Matrix, s0: Path, s1: Path) -> None:
    """Runs that go wrong or are asked for wrongly: a non-finite loss, resumes, folders in the way, protocols."""
    data = [*TASK, f"task.data_dir={m.data}"]
    run = m.path("nanloss")
    m.expect("NaN training loss (lr=1e30)", ["stage0", *data, *TRAIN, f"run_dir={run}", "train.save_every=1",
                                             "train.lr=1e30", "train.warmup_steps=0"], "non-finite training loss",
             intact=lambda: sorted(p.name for p in (run / "checkpoints").iterdir()) == ["0000001", "last"])
    m.expect("resume=true with no run", ["stage0", *data, *TRAIN, f"run_dir={m.path('none')}", "resume=true"],
             "does not exist")
    m.expect("existing run without resume", ["stage0", *data, *TRAIN, f"run_dir={s0}"], "already exists")
    file = m.path("file")
    file.write_text("x")
    m.expect("run_dir is a file", ["stage0", *data, *TRAIN, f"run_dir={file}"], "is a file")
    copy = m.path("resume")
    shutil.copytree(s0, copy, symlinks=True)
    m.expect("resume with another batch size", ["stage0", *data, *TRAIN, f"run_dir={copy}", "resume=true",
                                                "train.batch_size=8"], "train.batch_size=16", "resume_allow_changes")
    m.expect("unknown protocol", ["protocol", "ml46_multitask"], "ml46_multitask", "ml45_multitask")
    none = m.path("protocol")
    m.expect("few-shot protocol without its base", ["protocol", "ml45_fewshot", f"run_root={none}",
                                                    f"base_checkpoint={m.root}/nope"], "base_checkpoint",
             intact=lambda: not none.exists())
    m.expect("a protocol phase's bad value", ["protocol", "ml45_multitask", f"run_root={none}",
                                              "phases.stage1.train.steps=0"], "phases.stage1", "train.steps=0",
             intact=lambda: not none.exists())
    bare = m.path("bare")
    shutil.copytree(s1 / "checkpoints" / "last", bare)
    m.expect("eval of a checkpoint outside a run", ["eval", f"checkpoint={bare}", *EVAL], "out_dir",
             intact=lambda: not (bare.parent / "eval").exists())
    m.expect("eval over an earlier results.json", ["eval", f"checkpoint={s1}", *EVAL, "episodes_per_task=1"],
             "results.json exists")  # main() evaluated s1 into its default folder first
    shards = m.path("shards")
    shards.mkdir()
    shutil.copy(m.data / "button-press-v3.hdf5", shards / ".button-press-v3.shard00000.hdf5")
    m.expect("collect over shards of other settings", ["collect", *TASK, f"task.data_dir={shards}"], "other settings",
             intact=lambda: (shards / ".button-press-v3.shard00000.hdf5").is_file())


def filesystem_cases(m: Matrix, s0: Path) -> None:
    """A full disk (TensorBoard's first write, a checkpoint) and a read-only run folder, on a small tmpfs."""
    data = [*TASK, f"task.data_dir={m.data}"]
    fs = m.path("fs")
    if mount_tmpfs(fs):
        try:
            run = fs / "run"
            shutil.copytree(s0, run, symlinks=True)
            fill_disk(fs)
            resume = ["stage0", *data, *TRAIN, f"run_dir={run}", "resume=true", "train.steps=6",
                      "resume_allow_changes=[train.steps]"]
            kept = lambda: (run / "checkpoints" / "last").resolve().name == "0000004"  # noqa: E731
            m.expect("disk full (TensorBoard's first write)", resume, "no space left", intact=kept)
            m.expect("disk full while saving a checkpoint", [*resume, "logger.tensorboard=false"],
                     "cannot write checkpoint", intact=kept)
            subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
            m.expect("read-only run folder", ["stage0", *data, *TRAIN, f"run_dir={fs}/new"], "read-only")
        finally:
            subprocess.run(["umount", "-l", str(fs)], check=False)
    else:
        m.skip("disk full while saving", "cannot mount a tmpfs (needs root)")
        m.skip("read-only run folder", "cannot mount a tmpfs (needs root)")


def worker_fault(m: Matrix, s1: Path, sig: int, case: str) -> None:
    out = m.path("eval_fault")
    proc = subprocess.Popen([sys.executable, "-m", "ript.cli", "eval", f"checkpoint={s1}", f"out_dir={out}", *EVAL,
                             "workers.timeout_s=10"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = env_workers(proc.pid, 2)[0]
    time.sleep(2.0)  # into its first episode
    os.kill(victim, sig)
    _, err = proc.communicate(timeout=600)
    results = json.loads((out / "results.json").read_text()) if (out / "results.json").is_file() else {}
    counts = {k: results.get(k) for k in ("reruns", "worker_restarts")} | {"episodes": len(results.get("episodes", []))}
    lines = [line for line in err.strip().splitlines() if "replacing it" in line] + [f"results: {counts}"]
    m.record(case, proc.returncode, lines, 0, ("replacing it",),
             lambda: counts == {"reruns": 1, "worker_restarts": 1, "episodes": 8})




def start_writer(args: list[str], folder: Path) -> subprocess.Popen:
    """A ``ript`` job started in the background, once it holds ``folder``'s lock (its lock file names it)."""
    proc = subprocess.Popen([sys.executable, "-m", "ript.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError, ValueError):
            if json.loads((folder / ".ript.lock").read_text()).get("pid") == proc.pid:
                break
        time.sleep(0.05)
    return proc


def writers(m: Matrix, s0: Path, s1: Path) -> None:
    """One writer per folder, outputs checked before the first episode, each job's own Ctrl-C advice."""
    data = m.path("collecting")
    collect = ["collect", *TASK, f"task.data_dir={data}", "task.demos_per_task=30", "num_workers=1"]
    first = start_writer(collect, data)
    m.expect("second collect into a folder being collected", collect, "being written by PID", "ript collect")
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=300)
    m.record("Ctrl-C during collect", first.returncode, err.strip().splitlines(), 130,
             ("run the same command again",), lambda: "resume=true" not in err)
    run = m.path("resumed_twice")
    shutil.copytree(s0, run, symlinks=True)
    resume = ["stage0", *TASK, f"task.data_dir={m.data}", *TRAIN, f"run_dir={run}", "resume=true",
              "train.steps=2000", "resume_allow_changes=[train.steps,train.lr]"]
    first = start_writer(resume, run)
    m.expect("second stage0 resume of one run folder", [*resume, "train.lr=1e-2"], "being written by PID",
             "ript stage0")
    first.kill()
    first.wait()
    file = m.path("out_file")
    file.write_text("mine")
    m.expect("eval out_dir is a file", ["eval", f"checkpoint={s1}", f"out_dir={file}", *EVAL], "is a file",
             "out_dir", intact=lambda: file.read_text() == "mine")
    m.expect("protocol run_root is a file", ["protocol", "ml45_multitask", f"run_root={file}"], "is a file",
             "run_root", intact=lambda: file.read_text() == "mine")
    protocol_stopped(m)


def protocol_stopped(m: Matrix) -> None:
    """SIGTERM to a protocol while a phase runs: the phase ends with it, and nothing of it is left running."""
    train = "steps: 4, batch_size: 16, warmup_steps: 2, val_every: 2, save_every: 2, log_every: 1"
    proc = subprocess.Popen([sys.executable, "-m", "ript.cli", "protocol", "ml45_multitask", *TASK,
                             f"task.data_dir={m.data}", "algo=quest_small", f"run_root={m.path('protocol')}",
                             "gpus=1", "phases.stage1=null", "phases.eval=null", "phases.rl=null",
                             "phases.eval_rl=null",
                             f"++phases.stage0={{progress: false, train: {{{train}}}, data: {{val_fraction: 0.34}}}}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline, phase = time.time() + 120, []
    while time.time() < deadline and not phase and proc.poll() is None:
        phase = [p["pid"] for p in processes() if p["ppid"] == proc.pid and b"stage0" in p["cmdline"]]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    left = [p for p in processes() if p["pid"] in phase or p["ppid"] in (proc.pid, *phase)]
    m.record("SIGTERM to a protocol during a phase", proc.returncode, err.strip().splitlines(), 128 + signal.SIGTERM,
             ("the same command continues",), lambda: bool(phase) and not left)




def protocol_messages(m: Matrix) -> None:
    """A protocol under a run root and data folder named with non-ASCII characters and spaces, then what it says
    when the finished run is asked for other settings or one of its phase folders was deleted."""
    from ript.config import override

    root, data = m.root / "prötocol ü", m.root / "dätä 1"
    shutil.copytree(m.data, data)
    train = "steps: 4, batch_size: 16, warmup_steps: 2, val_every: 2, save_every: 2, log_every: 1"
    command = ["protocol", "ml45_multitask", *TASK, override("task.data_dir", data), "algo=quest_small",
               override("run_root", root), "gpus=1", "phases.stage1=null", "phases.eval=null", "phases.rl=null",
               "phases.eval_rl=null",
               f"++phases.stage0={{progress: false, train: {{{train}}}, data: {{val_fraction: 0.34}}}}"]
    code, err = ript(*command)
    m.record("protocol, non-ASCII spaced run root and data", code, err, 0, (),
             lambda: sorted(p.name for p in root.iterdir()) == ["protocol.json", "results.json", "stage0"]
             and (root / "stage0" / "checkpoints" / "last").exists())
    m.expect("protocol finished without a setting asked now", [*command, "phases.stage0.train.steps=6"],
             "phase stage0 finished", "without train.steps=6")
    m.expect("protocol finished with a setting not asked now", [*command, "~phases.stage0.data.val_fraction"],
             "phase stage0 finished", "with data.val_fraction=0.34, which this command does not ask for")
    shutil.rmtree(root / "stage0")
    for n in (1, 2):
        m.expect(f"protocol finished phase's folder deleted (run {n})", command, "phase stage0 is recorded as finished",
                 f"its folder {root / 'stage0'} is gone")




def disk_full_merge(m: Matrix) -> None:
    """A task file's merge on a full disk: h5py raises RuntimeError (errno 28); the finished shard is kept."""
    from ript.config import compose, to_dict
    from ript.envs.suites import task_horizon
    from ript.experts.collect import Collection, job_settings

    fs = m.path("merge_fs")
    if not mount_tmpfs(fs):
        m.skip("disk full while merging a task file", "cannot mount a tmpfs (needs root)")
        return
    try:
        args = [*TASK, f"task.data_dir={fs}", "task.task_names=[button-press-v3]", "episodes_per_job=3",
                "num_workers=1"]
        cfg = compose("collect", args)
        job = Collection(str(cfg.task.suite), fs, 3, to_dict(cfg.task.render), task_horizon(cfg.task), 0,
                         float(cfg.task.expert_noise), True, "{name}.hdf5").jobs(["button-press-v3"], 3)[0]
        shard = fs / ".button-press-v3.shard00000.hdf5"
        shutil.copy(m.data / "button-press-v3.hdf5", shard)  # a finished job's shard: only the merge is left
        with h5py.File(shard, "a") as f:
            f["data"].attrs["shard"] = json.dumps(job_settings(job))
        (fs / "spare").write_bytes(b"\0" * 65536)
        fill_disk(fs)
        (fs / "spare").unlink()  # room to create the merged file, not to fill it
        m.expect("disk full while merging a task file", ["collect", *args], "no space left",
                 intact=lambda: shard.is_file() and not (fs / "button-press-v3.hdf5").exists())
    finally:
        subprocess.run(["umount", "-l", str(fs)], check=False)
