"""The matrix's bookkeeping (a row per case, OK or not) and the tiny real setup every case starts from."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

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
