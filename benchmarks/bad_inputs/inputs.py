"""Cases of bad values, data files, checkpoints and settings: each refused with one line, nothing written."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import torch
from safetensors.torch import load_file, save_file

from benchmarks.bad_inputs.matrix import EVAL, TASK, TRAIN, Matrix, damaged_data, ript


def value_cases(m: Matrix, s1: Path) -> None:
    """Out-of-range values and unknown names, each job's own."""
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


def data_file_cases(m: Matrix) -> None:
    """Missing, truncated and malformed demonstration files."""
    data = [*TASK, f"task.data_dir={m.data}"]
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


def checkpoint_cases(m: Matrix, s0: Path, s1: Path) -> None:
    """Checkpoints of the wrong stage, missing or damaged, and a language cache of NaNs."""
    data = [*TASK, f"task.data_dir={m.data}"]
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




def _nan_weights(ckpt: Path) -> None:
    state = load_file(str(ckpt / "model.safetensors"))
    name = next(k for k, v in state.items() if v.is_floating_point() and v.numel() > 1)
    state[name][0] = float("nan")
    save_file(state, str(ckpt / "model.safetensors"))


