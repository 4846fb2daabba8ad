"""Success rate of the scripted LIBERO experts, per task, on the episodes ``ript collect`` would run.

    python -m benchmarks.libero_experts --suites libero_object libero_spatial --episodes 20 [--workers 2]
    python -m benchmarks.libero_experts --merge all.json changed_tasks.json --out joined.json

Runs the collection code path (same layout seeds, same action noise) without rendering: the experts read
the simulator state, so images do not change the outcome. Writes a JSON file and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import re
import time
from pathlib import Path

import numpy as np

from ript.envs.seeds import demo_layout_seed, demo_noise_rng


def run_task(args: tuple[str, str, int, int, float]) -> dict:
    from ript.envs.libero import LiberoTask
    from ript.errors import RiptError
    from ript.experts.libero.episode import run_episode
    from ript.experts.libero.goals import make_expert

    suite, name, episodes, seed, noise = args
    task = LiberoTask(suite, name, None)
    outcomes, lengths, t0 = [], [], time.perf_counter()
    try:
        task.reset(0, render=False)
        make_expert(task)
    except RiptError as e:  # a goal the experts do not script (open, close, turn on, push)
        task.close()
        return {"suite": suite, "task": name, "episodes": 0, "successes": 0, "mean_length": 0.0, "seconds": 0.0,
                "no_expert": str(e).split(": ", 1)[-1]}
    for episode in range(episodes):
        layout_seed = demo_layout_seed(seed, episode, 0)  # first try of each demo, as collect draws it
        rng = demo_noise_rng(seed, name, episode, 0)
        demo = run_episode(task, layout_seed, rng, noise, render=False)
        outcomes.append(bool(demo.attrs["success"]))
        lengths.append(len(demo.actions))
    task.close()
    return {"suite": suite, "task": name, "episodes": episodes, "successes": int(sum(outcomes)),
            "mean_length": float(np.mean(lengths)), "seconds": time.perf_counter() - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suites", nargs="+", default=["libero_object", "libero_spatial"])
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--noise", type=float, default=0.05, help="as the LIBERO task configs' expert_noise")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", default=None, help="a regular expression: only the tasks whose name it finds")
    parser.add_argument("--out", type=Path, default=Path("runs/libero_experts.json"))
    parser.add_argument("--merge", type=Path, nargs="+", default=None,
                        help="join earlier results instead of running: a task's row from a later file replaces it")
    a = parser.parse_args()
    if a.merge is not None:
        merged: dict[tuple[str, str], dict] = {}
        for path in a.merge:
            try:
                merged.update({(r["suite"], r["task"]): r for r in json.loads(path.read_text())["tasks"]})
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise SystemExit(f"error: {path}: not a results file of this benchmark ({e})") from None
        save(a.out, {"merged": [str(path) for path in a.merge]}, list(merged.values()))
        print_table(list(merged.values()))
        return
    from ript.envs.libero import suite_tasks

    jobs = [(s, n, a.episodes, a.seed, a.noise) for s in a.suites for n in suite_tasks(s)
            if a.only is None or re.search(a.only, n)]
    rows = []
    with mp.get_context("spawn").Pool(a.workers) as pool:
        # the file rewritten as each task finishes: a run cut short keeps the tasks it finished
        for row in pool.imap_unordered(run_task, jobs, chunksize=1):
            rows.append(row)
            save(a.out, vars(a), rows)
    order = {(s, n): i for i, (s, n, *_) in enumerate(jobs)}
    rows.sort(key=lambda r: order[(r["suite"], r["task"])])
    save(a.out, vars(a), rows)
    print_table(rows)


def save(out: Path, args: dict, rows: list[dict]) -> None:
    """The results file, written atomically (a run cut short keeps the tasks it finished)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps({"args": {k: str(v) for k, v in args.items()}, "tasks": rows}, indent=2))
    tmp.replace(out)


def print_table(rows: list[dict]) -> None:
    """A markdown table of the rows, suite by suite in their order, with each suite's total."""
    print("| suite | task | expert success | mean length |\n| --- | --- | --- | --- |")
    for suite in dict.fromkeys(r["suite"] for r in rows):
        mine = [r for r in rows if r["suite"] == suite]
        for r in mine:
            if "no_expert" in r:
                print(f"| {suite} | {r['task']} | no expert: {r['no_expert']} | |")
            else:
                print(f"| {suite} | {r['task']} | {r['successes']}/{r['episodes']} | {r['mean_length']:.0f} |")
        total = sum(r["successes"] for r in mine), sum(r["episodes"] for r in mine)
        print(f"| {suite} | **scripted tasks** | **{total[0]}/{total[1]} ({total[0] / max(1, total[1]):.1%})** | |")


if __name__ == "__main__":
    main()
