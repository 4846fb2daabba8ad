"""``python -m benchmarks.bad_inputs``: the setup, every case, the table."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bad_inputs import faults, inputs
from benchmarks.bad_inputs.matrix import EVAL, Matrix, ript, setup


def run_cases(m: Matrix, s0: Path, s1: Path) -> None:
    inputs.value_cases(m, s1)
    inputs.data_file_cases(m)
    inputs.checkpoint_cases(m, s0, s1)
    faults.run_cases(m, s0, s1)
    faults.filesystem_cases(m, s0)
    faults.worker_fault(m, s1, signal.SIGKILL, "env worker killed during eval")
    faults.worker_fault(m, s1, signal.SIGSTOP, "env worker stopped (hung) during eval")
    faults.writers(m, s0, s1)
    inputs.settings_matrix(m, s0, s1)
    inputs.lerobot_rows(m)
    faults.disk_full_merge(m)
    faults.protocol_messages(m)


def main() -> None:
    ap = argparse.ArgumentParser(description="The bad-input matrix: every input or fault a user can cause.")
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
        run_cases(m, s0, s1)
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
