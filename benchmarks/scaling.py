"""The scaling curve on whatever host this runs on: stage 1 (DDP) and one RL iteration (torchrun) at 1, 2, 4, 8
processes (as many as the host has GPUs; ``--cpu``: gloo processes on the CPU, for checking the script), with the
global batch and the groups per iteration fixed, so that N processes share the same work. Writes samples/s, env
steps/s (rollout alone and with training), the RL iteration's time by phase and the efficiency (speed-up / N) to
``scaling.json`` and ``scaling.png`` in ``--out``. ``--placements`` adds RL with each trainer process's rollouts in a
Ray actor of its own, on ``--actor-gpus`` GPUs (and with the next iteration's rollouts overlapping the update), at
every count whose trainers and actors fit the host's GPUs; the actors join one Ray head the script starts
(``hybrid``: the trainers on every GPU, the simulators rendering on the first half, the actors sharing the rest).

    python -m benchmarks.scaling [--counts 1,2,4,8] [--task metaworld_ml45_10] [--batch 1024] [--s1-steps 600]
        [--groups 32] [--k 8] [--iterations 3] [--episode-steps 200] [--out runs/scaling] [--cpu]
        [--task-extra task.* ...] [--extra stage-0/1 overrides ...] [--placements disaggregated,disaggregated_overlap]
        [--stages auto|1|2] [--actor-gpus 1|0.5] [--cores-per-gpu 16] [--base <stage-1 ckpt>] [--rl-extra rl.* ...]
        [--pin-cores] [--parts stage1,rl,reference] [--run-limit 1800]
    python -m benchmarks.scaling --plot runs/scaling/scaling.json   # the figure alone, from the results

Each stage runs as ``ript`` itself under torchrun (``torch.distributed.run``), reading its speed back from the run's
TensorBoard log: stage 1's median samples/s after its first ``--warmup`` steps, RL's last iteration (the first one
compiles), over its wall time since the previous update (``time/cycle``: checkpoint included). The demos, stage 0
and the one-process stage 1 that RL starts from are made once in ``--out`` and reused. Every run's console output is
kept in ``--out``/logs; a run that fails becomes a row that says why (its first error line; a run past
``--run-limit`` seconds is stopped with every process's stacks in its log), the curve goes on without it,
``scaling.json`` is rewritten after every row, and the script exits non-zero at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from benchmarks.train_compare import scalars
from ript.stages.protocol import Phase
from ript.utils.atomic import atomic_write_text
from ript.utils.processes import run_with_time_limit

RL_TIMES = ("time/rollout", "time/train", "time/train_prepare", "time/sync", "time/sync_rollout", "time/sync_update",
            "time/iteration", "time/cycle")
RL_SHARES = ("time/inference_share", "time/worker_busy_share", "time/driver_idle_share",  # a rollout's wall time
             "time/task_build_share",  # the part of the workers' busy time spent building simulator tasks
             "time/decision_rounds", "time/slot_occupancy")  # a rank's decisions in a row, the batch rows they used
RL_MEMORY = ("memory/peak_gib",)  # rank 0's GPU memory over the iteration


class RunFailed(RuntimeError):
    """A measured run that exited non-zero: its row records the error and the curve goes on without it."""


def ript(args: list[str], limit_s: float, procs: int = 1, env: dict[str, str] | None = None, log: Path | None = None,
         cores: list[int] | None = None) -> None:
    """``ript <job> <overrides>`` as the protocol launches a phase: under torchrun on ``procs`` processes, its
    console output kept whole in ``log``; with ``cores``, it and every process it starts run on those alone. A run
    still going after ``limit_s`` seconds fails with every process's stacks in its log."""
    job, *overrides = args
    code, _, err = run_with_time_limit(Phase(job, job, overrides).command(procs), limit_s,
                                       env={**os.environ, **(env or {})}, preexec_fn=pinned(cores))
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(err)
    if code is None:
        raise RunFailed(f"{job} on {procs} process(es) was still running after {limit_s:.0f} s and was stopped; "
                        f"its processes' stacks are in {log or 'no log kept'}")
    if code != 0:
        raise RunFailed(f"{job} on {procs} process(es) failed ({log or 'no log kept'}): {first_error(err)}")


def first_error(output: str) -> str:
    """The line that says what went wrong: the first error-like line of any process (a rank's NCCL message
    comes before the C++ frames and torchrun's summary, which a tail of the output would show instead)."""
    marks = ("error: ", "Error: ", "Error ", "Exception", "NCCL", "Watchdog", "Killed", "Signal ")
    lines = [line.strip() for line in output.splitlines()]
    found = next((line for line in lines if any(m in line for m in marks) and not line.startswith("frame #")), None)
    return (found or (lines[-1] if lines else "no output"))[:600]


def pinned(cores: list[int] | None):
    """A child's start-up that confines it (and its children) to ``cores``; None: the host's."""
    return None if cores is None else lambda: os.sched_setaffinity(0, cores)


def host_share(a, gpus: int) -> list[int] | None:
    """With --pin-cores, the cores a host of --cores-per-gpu cores per GPU gives ``gpus`` GPUs (on the CPU, per
    process): a run on fewer GPUs does not borrow the cores the others would bring."""
    if not a.pin_cores or not a.cores_per_gpu:
        return None
    return list(range(min(os.cpu_count() or 1, a.cores_per_gpu * gpus)))


def fresh(run_dir: Path) -> Path:
    """A measured run's folder, emptied: runs never start over in a folder that holds one."""
    shutil.rmtree(run_dir, ignore_errors=True)
    return run_dir


def prepare(a, out: Path, task: list[str], common: list[str]) -> Path:
    """The demos, stage 0 and a one-process stage 1 (RL's starting point), made once."""
    base = out / "stage1_base"
    if not (out / "stage0" / "checkpoints" / "last").exists():
        ript(["collect", *task, f"num_workers={os.cpu_count()}", "episodes_per_job=5"], a.run_limit,
             log=out / "logs" / "collect.log")
        ript(["stage0", *common, f"run_dir={out / 'stage0'}", f"train.steps={a.s1_steps}", "progress=false"],
             a.run_limit, log=out / "logs" / "stage0.log")
    if not (base / "checkpoints" / "last").exists():
        ript(["stage1", *common, *stage1_args(a, out, base, a.s1_steps)], a.run_limit,
             log=out / "logs" / "stage1_base.log")
    return base


def stage1_args(a, out: Path, run_dir: Path, steps: int, batch: int | None = None) -> list[str]:
    return [f"run_dir={run_dir}", f"stage0_checkpoint={out / 'stage0'}", f"train.steps={steps}",
            f"train.batch_size={batch or a.batch}", "train.log_every=10", "train.val_every=100000",
            "train.save_every=100000", "progress=false"]


def stage1_speed(a, out: Path, common: list[str], n: int, batch: int | None = None) -> dict:
    """Stage 1 on ``n`` processes at the global batch ``batch`` (--batch)."""
    batch = batch or a.batch
    tag = f"{n}" if batch == a.batch else f"{n}_batch{batch}"
    run_dir = fresh(out / f"stage1_{tag}")
    ript(["stage1", *common, *stage1_args(a, out, run_dir, a.s1_steps, batch)], a.run_limit, n,
         log=out / "logs" / f"stage1_{tag}.log", cores=host_share(a, n))
    speed = [v for step, v in scalars(run_dir)["time/samples_per_s"] if step > a.warmup]
    return {"samples_per_s": statistics.median(speed), "per_process_batch": batch // n}


def stage1_reference(a, out: Path, common: list[str], counts: list[int], rows: dict[int, dict], save) -> dict:
    """Stage 1 on one process at each count's per-process batch: N times it is what N processes would reach if
    their gradients' all-reduce cost nothing, which splits a count's shortfall into its smaller batches' and its
    communication's (``communication_efficiency``)."""
    reference: dict = {}
    for n in (n for n in counts if n > 1):
        row = measured(f"1 process at batch {a.batch // n}: stage 1", stage1_speed, a, out, common, 1,
                       a.batch // n)
        reference[n] = row
        if "failed" not in row and "failed" not in rows.get(n, {"failed": ""}):
            rows[n]["communication_efficiency"] = rows[n]["samples_per_s"] / (n * row["samples_per_s"])
        save()
    return reference


# RL with its rollouts in a Ray actor per trainer process (docs/distributed.md); on a GPU host each actor takes
# --actor-gpus GPUs (1: one of its own; a share such as 0.5: beside its trainer)
PLACEMENTS = {"disaggregated": ["placement.mode=disaggregated"],
              "disaggregated_overlap": ["placement.mode=disaggregated", "rl.overlap=true"],
              "disaggregated_fsdp": ["placement.mode=disaggregated", "rl.fsdp=true"],
              "hybrid": ["placement.mode=hybrid"],
              "hybrid_overlap": ["placement.mode=hybrid", "rl.overlap=true"]}


@contextmanager
def ray_head(gpus: list[int], cores: list[int] | None = None):
    """One Ray head on this host for every trainer process's rollout actor (``workers.ray_address=auto``),
    handing out ``gpus`` only: the torchrun trainers compute on the first GPUs, which Ray does not know; with
    ``cores``, its actors run on those alone."""
    ray_cli = [sys.executable, "-m", "ray.scripts.scripts"]  # the ``ray`` command, wherever pip put its scripts
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus)} if gpus else None
    subprocess.run([*ray_cli, "start", "--head", f"--num-gpus={len(gpus)}",
                    f"--num-cpus={len(cores) if cores else os.cpu_count()}", "--disable-usage-stats"],
                   check=True, capture_output=True, env=env, preexec_fn=pinned(cores))
    try:
        yield
    finally:
        subprocess.run([*ray_cli, "stop", "--force"], capture_output=True)


def placement_rows(a, out: Path, rl_common: list[str], base: Path, counts: list[int], gpus: int,
                   collocated: dict, save) -> dict:
    """Each --placements entry at every count whose trainers and actors fit the host's GPUs, with its speed-up
    over the collocated run of one process (``save()`` after each row)."""
    rows: dict = {}
    for name in (name for name in a.placements.split(",") if name):
        for n in counts:
            layout = placement_layout(a, name, n, gpus)
            if layout is None:
                continue
            ray_gpus, extra, held = layout
            with ray_head(ray_gpus, host_share(a, held)):
                row = measured(f"{name}, {n} trainer process(es): RL", rl_speed, a, out, rl_common, base, n,
                               f"{name}_{n}", (*extra, "workers.ray_address=auto"), held)
            one = collocated.get(min(collocated)) if collocated else None  # --parts placements: none
            if one and "failed" not in one and "failed" not in row:
                row["speedup_over_one_process"] = row["env_steps_per_s_with_training"] / \
                    one["env_steps_per_s_with_training"]
            row["gpus"] = held
            rows.setdefault(name, {})[n] = row
            save()
    return rows


def placement_layout(a, name: str, n: int, gpus: int) -> tuple[list[int], list[str], int] | None:
    """Where ``n`` trainer processes and their rollout actors go: the GPUs Ray hands out, the run's overrides,
    and the GPUs held in all; None where they do not fit the host. The trainers take GPUs 0..n-1; an actor of a
    GPU of its own (--actor-gpus 1) the next ones, a share of one (0.5) the trainers'. ``hybrid``: the trainers'
    GPUs split in two halves, the simulators rendering on the first, the actors sharing the second."""
    hybrid = "placement.mode=hybrid" in PLACEMENTS[name]
    per_rank = 1 + (a.actor_gpus if a.actor_gpus >= 1 and not hybrid else 0)  # a trainer's GPU and its actor's own
    workers = workers_per_rank(a, int(per_rank))
    if a.cpu:
        return None if hybrid else ([], [*PLACEMENTS[name], *workers], n)
    if hybrid:
        if n < 2:
            return None
        env, actors = list(range(n // 2)), list(range(n // 2, n))
        return actors, [*PLACEMENTS[name], f"placement.env_gpus=[{','.join(map(str, env))}]",
                        f"placement.rollout_gpus={len(actors) / n:g}", *workers], n
    held = int(n * per_rank)
    if held > gpus:
        return None
    actors = list(range(n, held)) if a.actor_gpus >= 1 else list(range(n))
    return actors, [*PLACEMENTS[name], f"placement.rollout_gpus={a.actor_gpus:g}", *workers], held


def measured(what: str, measure, *args, **kwargs) -> dict:
    """``measure(*args, **kwargs)``'s row, printed; a run that failed gives a row that says so, and the curve goes
    on."""
    try:
        row = measure(*args, **kwargs)
    except RunFailed as e:
        print(f"{what}: {e}", flush=True)
        return {"failed": str(e)}
    speed = row.get("samples_per_s", row.get("env_steps_per_s_with_training"))
    unit = "samples/s" if "samples_per_s" in row else "env steps/s with training"
    print(f"{what} {speed:.0f} {unit} {json.dumps(row)}", flush=True)
    return row


def workers_per_rank(a, gpus_per_rank: int) -> list[str]:
    """Each trainer process's env workers: --cores-per-gpu for each GPU it holds (its rollout actor's too), as
    hosts of that many cores per GPU would give; none on the CPU or with 0 (ript's own share of this host)."""
    return [] if a.cpu or not a.cores_per_gpu else [f"rl.num_workers={a.cores_per_gpu * gpus_per_rank}"]


def rl_speed(a, out: Path, common: list[str], base: Path, n: int, tag: str | None = None,
             extra: tuple[str, ...] = (), held: int | None = None) -> dict:
    """One RL run on ``n`` trainer processes (``held``: the GPUs they and their rollout actors hold; ``n``)."""
    run_dir = fresh(out / f"rl_{tag or n}")
    # one collocated process renders on its own GPU, as on a host of one GPU (alone on a host of several, it
    # would render on the others); each torchrun rank renders on its own GPU anyway
    env = {"MUJOCO_EGL_DEVICE_ID": "0"} if tag is None and n == 1 and not a.cpu else None
    ript(["rl", *common, f"checkpoint={base}", f"run_dir={run_dir}", f"rl.iterations={a.iterations}",
          f"rl.groups_per_iteration={a.groups}", f"rl.rollouts_per_group={a.k}", "rl.max_sampling_rounds=1",
          "rl.oversample=1", f"rl.max_episode_steps={a.episode_steps}", "eval.every=0", *extra], a.run_limit, n, env,
         out / "logs" / f"rl_{tag or n}.log", host_share(a, held or n))
    s = scalars(run_dir)
    last = {tag: s[tag][-1][1] for tag in (*RL_TIMES, *RL_SHARES, *RL_MEMORY, "time/env_steps_per_s") if tag in s}
    rollout_steps = last["time/env_steps_per_s"] * last["time/rollout"]
    # the last iteration's wall time since the previous update (its checkpoint included): rollouts overlapping the
    # update also run under the checkpoint, which an iteration's own time leaves out
    wall = last.get("time/cycle", last.get("time/iteration", last["time/rollout"] + last["time/train"]))
    return {"env_steps": rollout_steps, "env_steps_per_s": last["time/env_steps_per_s"],
            "env_steps_per_s_with_training": rollout_steps / wall,
            "seconds": {tag.split("/")[1]: last[tag] for tag in RL_TIMES if tag in last},
            **{tag.split("/")[1]: last[tag] for tag in (*RL_SHARES, *RL_MEMORY) if tag in last}}


def efficiency(rows: dict[int, dict], key: str) -> None:
    """Each row's speed-up over the fewest processes measured and per process added (failed runs left out)."""
    done = {n: row for n, row in rows.items() if "failed" not in row}
    if not done:
        return
    first = min(done)
    for n, row in done.items():
        row["speedup"] = row[key] / done[first][key]
        row["efficiency"] = row["speedup"] / (n / first)


def plot(result: dict, path: Path) -> None:
    try:
        import matplotlib.pyplot as plt
    except ImportError:  # a GPU host without it: the figure is drawn later from the JSON (--plot)
        print(f"matplotlib is missing: draw {path.name} later with --plot {path.with_suffix('.json')}")
        return
    plt.switch_backend("Agg")  # the figure is only written

    if not (result["stage1"] or result["rl"]):
        return  # placements alone: no collocated curve to draw them against
    fig, ax = plt.subplots(figsize=(5, 4))
    lines = [*((("stage 1", result["stage1"], "speedup"),) if result["stage1"] else ()),
             ("RL iteration", result["rl"], "speedup"),
             *((f"RL, {name}", rows, "speedup_over_one_process") for name, rows in result["rl_placements"].items())]
    for name, rows, key in lines:
        # failed runs have no point; a placement's at the GPUs its trainers and actors hold
        done = sorted((int(row.get("gpus", n)), row[key]) for n, row in rows.items() if key in row)
        ax.plot([g for g, _ in done], [v for _, v in done], "o-", label=name)
    counts = sorted(int(n) for n in result["stage1"] or result["rl"])
    ax.plot(counts, [n / counts[0] for n in counts], "k:", label="linear")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("speed-up")
    ax.set_xticks(counts)
    ax.set_title(result["host"])
    ax.legend()
    fig.savefig(path, dpi=110, bbox_inches="tight")


def host_name(cpu: bool) -> str:
    import torch
    if cpu or not torch.cuda.is_available():
        return f"CPU, {os.cpu_count()} cores (gloo)"
    return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}, {os.cpu_count()} cores"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--counts", default="1,2,4,8")
    ap.add_argument("--task", default="metaworld_ml45_10")
    ap.add_argument("--batch", type=int, default=1024, help="stage 1's global batch")
    ap.add_argument("--s1-steps", type=int, default=600)
    ap.add_argument("--warmup", type=int, default=200, help="stage-1 steps left out of the speed (compiling)")
    ap.add_argument("--groups", type=int, default=32, help="RL groups per iteration, over all processes")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=3, help="RL iterations per run; the last is measured (the "
                    "first compiles, and rollouts running ahead reach their steady state in the third)")
    ap.add_argument("--episode-steps", type=int, default=200)
    ap.add_argument("--out", default="runs/scaling")
    ap.add_argument("--cpu", action="store_true", help="gloo processes on the CPU (checks the script)")
    ap.add_argument("--task-extra", nargs="*", default=[], help="task.* overrides, for every job")
    ap.add_argument("--extra", nargs="*", default=[], help="overrides for stages 0 and 1 (e.g. algo=...)")
    ap.add_argument("--rl-extra", nargs="*", default=[], help="overrides for every RL run (e.g. rl.compile=false)")
    ap.add_argument("--stages", default="auto", help="the runner's workers.pipeline_stages for every RL run")
    ap.add_argument("--actor-gpus", type=float, default=1.0,
                    help="GPUs of each rollout actor in --placements runs (a share such as 0.5: beside its trainer)")
    ap.add_argument("--placements", default="", help=f"RL again with each trainer process's rollouts in a Ray actor, "
                    f"for each of {','.join(PLACEMENTS)} given (comma-separated), at every count that fits")
    ap.add_argument("--parts", default="stage1,rl", help="what to measure at each count: stage1, rl (collocated, "
                    "then --placements), placements (--placements alone), reference (stage 1 on one process at "
                    "each count's per-process batch: the count's speed without communication)")
    ap.add_argument("--cores-per-gpu", type=int, default=16, help="env workers per GPU of each RL run (the cores "
                    "a host gives each GPU, so that N GPUs bring N times the simulators; 0: this host's cores shared "
                    "among the processes)")
    ap.add_argument("--pin-cores", action="store_true", help="run each measurement on --cores-per-gpu cores per "
                    "GPU it holds (per process on the CPU) and no more, as hosts of that many cores per GPU would")
    ap.add_argument("--run-limit", type=float, default=1800.0,
                    help="seconds a run may take; one still going then is stopped, its processes' stacks in its log, "
                         "and its row says so")
    ap.add_argument("--base", help="RL's start: this stage-1 checkpoint, made elsewhere (--parts rl; skips the "
                    "demos and stages 0-1)")
    ap.add_argument("--plot", help="only draw the figure of this scaling.json (beside it)")
    return ap.parse_args()


def main() -> None:
    a = parse_args()
    if a.plot:
        plot(json.loads(Path(a.plot).read_text()), Path(a.plot).with_suffix(".png"))
        return
    import torch

    gpus = 0 if a.cpu else torch.cuda.device_count()
    counts = [n for n in (int(c) for c in a.counts.split(",")) if a.cpu or n <= gpus]
    if not counts:
        raise SystemExit(f"--counts {a.counts}: this host has {gpus} GPUs (--cpu runs gloo processes)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    task = [f"task={a.task}", *a.task_extra]
    device = ["device=cpu"] if a.cpu else []
    rl_common = [*task, *device, f"workers.pipeline_stages={a.stages}", *a.rl_extra]
    common = [*task, *device, *a.extra]  # stages 0 and 1
    try:
        base = Path(a.base) if a.base else prepare(a, out, task, common)
    except RunFailed as e:  # nothing to measure without the demos and stages 0-1
        raise SystemExit(str(e)) from None
    command = " ".join(["python -m benchmarks.scaling", *sys.argv[1:]])
    result = {"host": host_name(a.cpu), "command": command, "stage1": {}, "rl": {}, "rl_placements": {},
              "stage1_one_process": {}}

    def save() -> None:  # after each row: a host taken back mid-curve still leaves the rows measured so far
        atomic_write_text(Path(out / "scaling.json"), json.dumps(result, indent=2))

    parts = set(a.parts.split(","))
    for n in counts:
        if "stage1" in parts:
            result["stage1"][n] = measured(f"{n} process(es): stage 1", stage1_speed, a, out, common, n)
            save()
        if "rl" in parts:
            result["rl"][n] = measured(f"{n} process(es): RL", rl_speed, a, out, rl_common, base, n,
                                       extra=tuple(workers_per_rank(a, 1)))
            save()
    if parts & {"rl", "placements"}:
        result["rl_placements"] = placement_rows(a, out, rl_common, base, counts, gpus, result["rl"], save)
    for rows, key in ((result["stage1"], "samples_per_s"), (result["rl"], "env_steps_per_s_with_training")):
        efficiency(rows, key)
    if "reference" in parts:  # after the counts' own rows, which it is read against
        result["stage1_one_process"] = stage1_reference(a, out, common, counts, result["stage1"], save)
    save()
    plot(result, out / "scaling.png")
    print(json.dumps({part: {n: round(r["speedup"], 2) for n, r in rows.items() if "speedup" in r}
                      for part, rows in (("stage1", result["stage1"]), ("rl", result["rl"]))}))
    failed = [row["failed"] for part in ("stage1", "rl") for row in result[part].values() if "failed" in row] + \
        [row["failed"] for rows in result["rl_placements"].values() for row in rows.values() if "failed" in row]
    if failed:
        raise SystemExit(f"{len(failed)} run(s) failed; the first: {failed[0]}")


if __name__ == "__main__":
    main()
