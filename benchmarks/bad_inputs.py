"""The bad-input matrix: every input or fault a user can cause, through the real ``ript`` command.

    MUJOCO_GL=egl python -m benchmarks.bad_inputs [--out benchmarks/results/bad_inputs.json]

Builds a tiny real setup in a temporary folder (MetaWorld, 2 tasks x 3 demos, stage 0 and stage 1 for a few
steps), then runs each case and prints a table: case, exit code, the first line of the error, OK. A case is
OK when the command exits as expected (2 with exactly one ``error:`` line holding the expected words and no
traceback, or 0 where the run must survive the fault) and what it must not touch is untouched. The read-only
and disk-full cases need to mount a tmpfs (root); elsewhere they are reported as skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import torch
from safetensors.torch import load_file, save_file

from tests.helpers.faults import env_workers, fill_disk, processes

TASK = ["task=metaworld_quick", "task.demos_per_task=3", "task.render.image_size=32", "task.max_episode_steps=120"]
TRAIN = ["algo=quest_small", "progress=false", "train.steps=4", "train.batch_size=16", "train.warmup_steps=2",
         "train.log_every=1", "train.val_every=2", "train.save_every=2", "data.val_fraction=0.34"]
EVAL = ["episodes_per_task=4", "num_workers=2", "workers.envs_per_worker=1", "max_episode_steps=120", "n_videos=0"]


def ript(*args: str, timeout: float = 600) -> tuple[int, list[str]]:
    proc = subprocess.run([sys.executable, "-m", "ript.cli", *args], capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stderr.strip().splitlines()


class Matrix:
    def __init__(self, root: Path):
        self.root = root
        self.data = root / "data"
        self.rows: list[dict] = []
        self.n = 0

    def path(self, name: str) -> Path:
        self.n += 1
        return self.root / f"case{self.n:02d}_{name}"

    def record(self, case: str, code: int, err: list[str], expect_code: int, words: tuple[str, ...],
               intact: Callable[[], bool] = lambda: True) -> None:
        errors = [line for line in err if line.startswith("error: ")]
        first = errors[0] if errors else (err[-1] if err else "")
        if expect_code == 2:
            ok = (code == 2 and len(errors) == 1 and not any(line.startswith("Traceback") for line in err)
                  and all(w in errors[0] for w in words))
        else:
            ok = code == expect_code and all(any(w in line for line in err) for w in words)
        ok = ok and intact()
        self.rows.append({"case": case, "exit": code, "first_line": first[:150], "ok": ok})
        print(f"{'OK ' if ok else 'BAD'} {code:>3}  {case:<44} {first[:110]}", flush=True)

    def expect(self, case: str, args: list[str], *words: str, intact: Callable[[], bool] = lambda: True) -> None:
        code, err = ript(*args)
        self.record(case, code, err, 2, words, intact)

    def skip(self, case: str, why: str) -> None:
        self.rows.append({"case": case, "exit": None, "first_line": f"skipped: {why}", "ok": None})
        print(f"--- ---  {case:<44} skipped: {why}", flush=True)


def setup(root: Path) -> tuple[Path, Path, Path]:
    data, s0, s1 = root / "data", root / "stage0", root / "stage1"
    for job, args in (("collect", ["episodes_per_job=2", "num_workers=2"]),
                      ("stage0", TRAIN + [f"run_dir={s0}"]),
                      ("stage1", TRAIN + [f"run_dir={s1}", f"stage0_checkpoint={s0}"])):
        code, err = ript(job, *TASK, f"task.data_dir={data}", *args)
        if code != 0:
            raise SystemExit(f"setup {job} failed: {err[-1] if err else code}")
    return data, s0, s1


def damaged_data(m: Matrix, name: str, damage: Callable[[Path], None]) -> list[str]:
    folder = m.path(name)
    shutil.copytree(m.data, folder)
    damage(folder / "drawer-close-v3.hdf5")
    return [*TASK, f"task.data_dir={folder}", *TRAIN, f"run_dir={folder}/run"]


def mount_tmpfs(where: Path) -> bool:
    where.mkdir(parents=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(where)],
                          capture_output=True).returncode == 0


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


def run_matrix(m: Matrix, s0: Path, s1: Path) -> None:
    data = [*TASK, f"task.data_dir={m.data}"]
    # values
    for job, override, words in [
        ("stage1", "algo.n_layers=4", ("algo.n_layers",)), ("collect", "task=metaworld_ml46", ("metaworld_ml46",)),
        ("collect", "task.task_names=[pick-plaec-v3]", ("pick-plaec-v3",)),
        ("stage0", "train.steps=0", ("train.steps=0",)), ("stage0", "train.steps=-5", ("train.steps=-5",)),
        ("stage0", "train.batch_size=0", ("train.batch_size=0",)), ("stage0", "train.save_every=0", ("save_every",)),
        ("stage0", "train.keep_last=-1", ("train.keep_last=-1",)), ("stage0", "train.lr=nan", ("train.lr",)),
        ("stage0", "data.val_fraction=1.5", ("val_fraction",)),
        ("collect", "episodes_per_job=0", ("episodes_per_job",)),
        ("collect", "noise=-0.1", ("noise",)), ("eval", "episodes_per_task=-1", ("episodes_per_task=-1",)),
        ("eval", "episodes_per_task=0", ("episodes_per_task=0",)), ("rl", "rl.iterations=0", ("rl.iterations=0",)),
        ("rl", "rl.rollouts_per_group=0", ("rl.rollouts_per_group",)), ("rl", "rl.advantage=ppo2", ("rl.advantage",)),
        ("rl", "rl.reward=shaped", ("rl.reward",)), ("rl", "rl.critic.lr=0", ("rl.critic.lr",)),
        ("rl", "rl.clip_ratio_c=0.5", ("rl.clip_ratio_c",)),
    ]:
        run = m.path("value")
        extra = [f"checkpoint={s1}"] if job in ("eval", "rl") else []
        extra += [f"run_dir={run}"] if job in ("stage0", "stage1", "rl") else []
        m.expect(f"{job} {override}", [job, override, *extra], *words, intact=lambda run=run: not run.exists())
    # files
    m.expect("missing data folder", ["stage0", *TASK, f"task.data_dir={m.root}/nothing", f"run_dir={m.path('r')}"],
             "does not exist")

    def truncate(p: Path) -> None:
        p.write_bytes(p.read_bytes()[:20000])

    def nan_action(p: Path) -> None:
        with h5py.File(p, "a") as f:
            f["data/demo_2/actions"][5, 0] = np.nan

    def wrong_dim(p: Path) -> None:
        with h5py.File(p, "a") as f:
            n = len(f["data/demo_0/rewards"])
            del f["data/demo_0/actions"]
            f["data/demo_0/actions"] = np.zeros((n, 7), dtype=np.float32)

    def official_layout(p: Path) -> None:  # LIBERO's own files hold no noise-free labels
        with h5py.File(p, "a") as f:
            del f["data/demo_1/expert_actions"]

    m.expect("noise-free labels missing", ["stage0", *damaged_data(m, "official", official_layout),
                                           "data.action_key=expert_actions"], "demo_1/expert_actions is missing")
    labels = m.path("labels")
    m.expect("unknown label key", ["stage0", *data, *TRAIN, f"run_dir={labels}", "data.action_key=clean"],
             "data.action_key='clean'", intact=lambda: not labels.exists())
    m.expect("truncated HDF5", ["stage0", *damaged_data(m, "trunc", truncate)], "corrupt or truncated")
    m.expect("NaN in an HDF5 action", ["stage0", *damaged_data(m, "nan", nan_action)], "NaN")
    m.expect("wrong action dimension", ["stage0", *damaged_data(m, "dim", wrong_dim)], "action dim 7")
    m.expect("wrong-stage checkpoint", ["eval", f"checkpoint={s0}"], "stage 'stage0'")
    m.expect("missing checkpoint", ["eval", f"checkpoint={m.root}/nope"], "does not exist")
    for name, damage, words in [
        ("truncated weights",
         lambda c: (c / "model.safetensors").write_bytes((c / "model.safetensors").read_bytes()[:999]),
         ("model.safetensors",)),
        ("NaN weights", _nan_weights, ("NaN",)),
        ("truncated config.json", lambda c: (c / "config.json").write_text((c / "config.json").read_text()[:50]),
         ("config.json",)),
    ]:
        copy = m.path("ckpt") / "checkpoints" / "0000004"
        shutil.copytree(s1 / "checkpoints" / "last", copy)
        damage(copy)
        m.expect(name, ["eval", f"checkpoint={copy}", *EVAL], *words,
                 intact=lambda copy=copy: not (copy.parent.parent / "eval").exists())
    cache = m.path("cache") / "lang.safetensors"
    cache.parent.mkdir()
    shutil.copy(m.data / "lang_cache.safetensors", cache)
    save_file({k: torch.full_like(v, float("nan")) for k, v in load_file(str(cache)).items()}, str(cache))
    run = m.path("run")
    m.expect("NaN language cache", ["stage1", *data, *TRAIN, f"run_dir={run}", f"stage0_checkpoint={s0}",
                                    f"lang.cache_file={cache}"], "NaN", intact=lambda: not run.exists())
    # runs
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
    # the filesystem
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
    worker_fault(m, s1, signal.SIGKILL, "env worker killed during eval")
    worker_fault(m, s1, signal.SIGSTOP, "env worker stopped (hung) during eval")
    writers(m, s0, s1)


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


def settings_matrix(m: Matrix, s0: Path, s1: Path) -> None:
    """Outputs checked against the settings asked for, inputs against their names, settings a job cannot apply,
    and malformed state files and external datasets."""
    data = [*TASK, f"task.data_dir={m.data}"]
    stamps = {p: p.stat().st_mtime_ns for p in m.data.glob("*.hdf5")}
    untouched = lambda: {p: p.stat().st_mtime_ns for p in m.data.glob("*.hdf5")} == stamps  # noqa: E731
    m.expect("collect over files of other settings", ["collect", *data, "noise=0.1"], "noise=0.2 (this run: 0.1)",
             intact=untouched)
    bare = m.path("bare_data")
    shutil.copytree(m.data, bare)
    for f in bare.glob("*.hdf5"):
        with h5py.File(f, "a") as h:
            del h["data"].attrs["collection"]
    m.expect("collect over files without recorded settings", ["collect", *TASK, f"task.data_dir={bare}"],
             "records no collection settings")
    m.expect("a task file replaced by another task's",
             ["stage0", *damaged_data(m, "swap", lambda p: shutil.copy(p.with_name("button-press-v3.hdf5"), p))],
             "loaded for task 'drawer-close-v3'")
    m.expect("task.task_names with a duplicate", ["stage0", *data, *TRAIN, f"run_dir={m.path('dup')}",
                                                   "task.task_names=[drawer-close-v3,drawer-close-v3]"],
             "listed more than once")
    m.expect("task.task_names=[]", ["collect", *data, "task.task_names=[]"], "an empty list names no task")
    own_algo = [a for a in TRAIN if not a.startswith("algo=")]
    for override, args, words in (("algo=quest", [*own_algo, "algo=quest"], "algo.name='quest'"),
                                  ("algo.prior.n_layer=4", [*TRAIN, "algo.prior.n_layer=4"], "algo.prior.n_layer=4")):
        run = m.path("ft")
        m.expect(f"finetune {override}", ["finetune", *data, *args, f"run_dir={run}", f"checkpoint={s1}"], words,
                 "differs from the base", intact=lambda run=run: not run.exists())
    run = m.path("bigbatch")
    m.expect("stage1 batch larger than the training set", ["stage1", *data, *TRAIN, f"run_dir={run}",
                                                            f"stage0_checkpoint={s0}", "train.batch_size=5000"],
             "larger than the training split", intact=lambda: not run.exists())
    changed = m.path("changed")
    shutil.copytree(m.data, changed / "data")
    shutil.copytree(s0, changed / "run", symlinks=True)
    with h5py.File(changed / "data" / "drawer-close-v3.hdf5", "a") as f:
        del f["data/demo_2"]
    m.expect("resume over changed data files", ["stage0", *TASK, f"task.data_dir={changed / 'data'}", *TRAIN,
                                                f"run_dir={changed / 'run'}", "resume=true", "train.steps=6",
                                                "resume_allow_changes=[task.data_dir,train.steps]"],
             "drawer-close-v3.hdf5", "resume_allow_changes=[data]")
    for name, state, words in (("protocol.json record without overrides", {"phases": {"collect": {"seconds": 3}}},
                                ("phases.collect.overrides",)),
                               ("protocol.json a list", [{"phases": {}}], ("not a protocol record",)),
                               ("protocol.json string duration",
                                {"phases": {"collect": {"overrides": [], "seconds": "3 min"}}}, ("seconds",))):
        root = m.path("state")
        root.mkdir()
        (root / "protocol.json").write_text(json.dumps(state))
        m.expect(name, ["protocol", "ml45_multitask", f"run_root={root}"], "protocol.json", *words)
    lerobot_rows(m)
    disk_full_merge(m)
    protocol_messages(m)


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


def lerobot_rows(m: Matrix) -> None:
    exported = m.path("lerobot")
    code, err = ript("export", *TASK, f"task.data_dir={m.data}", f"out={exported}")
    if code != 0:
        m.skip("malformed LeRobot folders", f"export failed: {err[-1] if err else code}")
        return

    def info(change: Callable[[dict], object]) -> Callable[[Path], None]:
        return lambda f: (f / "meta/info.json").write_text(json.dumps(change(json.loads((f / "meta/info.json")
                                                                                      .read_text()))))

    def truncate(rel: str) -> Callable[[Path], None]:
        return lambda f: (f / rel).write_bytes((f / rel).read_bytes()[:len((f / rel).read_bytes()) // 2])

    for case, damage, words in (
            ("LeRobot info.json without features", info(lambda i: {k: v for k, v in i.items() if k != "features"}),
             "'features'"),
            ("LeRobot info.json a list", info(lambda i: [i]), "holds a list"),
            ("LeRobot truncated mp4", truncate("videos/observation.images.corner_rgb/chunk-000/file-000.mp4"),
             "file-000.mp4"),
            ("LeRobot half-written parquet", truncate("data/chunk-000/file-000.parquet"), "unreadable parquet")):
        folder = m.path("lerobot_bad")
        shutil.copytree(exported, folder)
        damage(folder)
        out = m.path("imported")
        m.expect(case, ["import", f"src={folder}", f"data_dir={out}"], words,
                 intact=lambda out=out: not out.exists() or not any(out.iterdir()))


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


def _nan_weights(ckpt: Path) -> None:
    state = load_file(str(ckpt / "model.safetensors"))
    name = next(k for k, v in state.items() if v.is_floating_point() and v.numel() > 1)
    state[name][0] = float("nan")
    save_file(state, str(ckpt / "model.safetensors"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="write the table as JSON here")
    args = ap.parse_args()
    os.environ.setdefault("MUJOCO_GL", "egl")
    with tempfile.TemporaryDirectory(prefix="ript_bad_inputs_") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        m = Matrix(root)
        m.data, s0, s1 = setup(root)
        code, err = ript("eval", f"checkpoint={s1}", *EVAL, "episodes_per_task=1")  # for the results.json case
        if code != 0:
            raise SystemExit(f"setup eval failed: {err[-1] if err else code}")
        run_matrix(m, s0, s1)
        settings_matrix(m, s0, s1)
    bad = [r for r in m.rows if r["ok"] is False]
    print("\n| case | exit | first line | OK |\n| --- | --- | --- | --- |")
    for r in m.rows:
        mark = "skipped" if r["ok"] is None else ("OK" if r["ok"] else "FAILED")
        print(f"| {r['case']} | {r['exit']} | {r['first_line'].replace('|', '/')} | {mark} |")
    print(f"\n{len(m.rows) - len(bad)} of {len(m.rows)} cases OK in {time.perf_counter() - t0:.0f} s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(m.rows, indent=2))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
