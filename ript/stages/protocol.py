"""``ript protocol <name>``: a reference protocol end to end in one command.

A protocol (``configs/protocol/<name>.yaml``) names the task and the overrides of each phase: scripted
demonstrations, stage 0, stage 1 or few-shot fine-tuning, the suite's evaluation, RL, the evaluation again.
Each phase is the ``ript`` job of the same name run in its own process (its memory is freed before the next
one starts; with several GPUs the training phases run under torchrun). ``<run_root>/protocol.json`` records
every finished phase with its command and time, so the same command run again skips them and resumes an
interrupted training phase from its last checkpoint. At the end it prints the per-task table of every
evaluation and writes it, with each phase's time, to ``<run_root>/results.json``.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ript.config import CONFIG_DIR, compose, override, to_dict
from ript.errors import RiptError
from ript.stages.protocol_results import protocol_table, summarize
from ript.stages.protocol_state import STATE_FILE, finished_difference, read_state
from ript.utils.atomic import atomic_write_text
from ript.utils.locking import holding
from ript.utils.logging import log, setup_console_logging
from ript.utils.processes import run_child
from ript.utils.run_dir import flatten

PHASES = ("collect", "stage0", "stage1", "finetune", "flow", "eval", "world_model", "world_model_head", "calibrate",
          "rl", "eval_rl")
JOBS = {**{name: name for name in PHASES}, "calibrate": "eval", "eval_rl": "eval"}
NEEDS = {"calibrate": ("eval", "world_model"), "world_model_head": ("world_model",)}  # the phases whose output it reads
TRAINING = ("stage0", "stage1", "finetune", "flow", "world_model", "rl")  # under torchrun when several GPUs are used
IMITATION = ("finetune", "flow", "stage1")  # the first of these a protocol runs is its imitation phase
PHASE_OF = "RIPT_PHASE_OF"  # set in a phase's environment: the job that runs it, which says how to continue


def protocol_names() -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / "protocol").glob("*.yaml"))


def leaf_overrides(prefix: str, node: Any) -> list[str]:
    """A nested mapping as hydra overrides, one per leaf: ``{"train": {"steps": 5}}`` -> ``train.steps=5``."""
    return [f"{key}={json.dumps(value, ensure_ascii=False)}" for key, value in flatten(node, prefix).items()]


def group_overrides(group: str, node) -> list[str]:
    """A composed config group (``task``, ``algo``) as overrides for another job's config: the group's name and
    every leaf, so command-line changes such as ``algo.prior.n_layer=4`` reach every phase."""
    return [f"{group}={node.name}", *leaf_overrides(group, to_dict(node))]


@dataclass
class Phase:
    name: str
    job: str
    overrides: list[str]
    run_dir: Path | None = None   # training phases: resumed from its last checkpoint if a try was cut short
    out_dir: Path | None = None   # evaluations: where results.json lands
    last_step: int | None = None  # training phases: the step (RL: iteration) that finishes them
    env_step_budget: int | None = None  # RL: rl.max_env_steps, which can finish it before its last iteration
    reads: tuple[Path, ...] = ()  # the earlier phases' folders it loads from
    batch_size: int | None = None  # imitation-type training phases: train.batch_size, the global batch

    def ranks(self, gpus: int, min_batch_per_gpu: int | None) -> int:
        """The processes this phase runs in: one unless it trains; a training phase of a global batch smaller
        than ``min_batch_per_gpu`` per GPU on fewer GPUs (None: on all ``gpus``), since a GPU's step at a small
        batch costs nearly what it does at a larger one (docs/speed.md, the scaling curve)."""
        if self.name not in TRAINING:
            return 1
        if min_batch_per_gpu is None or self.batch_size is None:
            return gpus
        return max(1, min(gpus, self.batch_size // min_batch_per_gpu))

    def command(self, ranks: int) -> list[str]:
        launcher = [sys.executable, "-m", "ript.cli"]
        if ranks > 1:
            launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
                        "-m", "ript.cli"]
        return [*launcher, self.cli_name, *self.overrides]

    @property
    def cli_name(self) -> str:
        """The job's command (its config file's name with dashes: world_model -> world-model)."""
        return self.job.replace("_", "-")


def imitation_phase(cfg) -> str:
    """The protocol's imitation phase: few-shot fine-tuning if it has one, else the flow policy's, else stage 1."""
    return next((name for name in IMITATION if cfg.phases[name] is not None), "stage1")


def imitation_dir(cfg) -> Path:
    return Path(cfg.run_root) / imitation_phase(cfg)


def plan(cfg) -> list[Phase]:
    """The protocol's phases in order, each with the overrides that wire it to the others."""
    root = Path(cfg.run_root)
    task, algo = group_overrides("task", cfg.task), group_overrides("algo", cfg.algo)
    imitation = imitation_dir(cfg)
    start = imitation / ("checkpoints/best" if cfg.evaluate == "best" else "")
    family = ["policy=flow"] if imitation_phase(cfg) == "flow" else []  # the jobs that load its checkpoints
    # with a world_model phase, RL's rollouts run in it (the evaluations stay in the simulator); with a
    # world_model_head phase, in the same model with the head it trained on the model's own imagination
    world_model_dir = root / ("world_model" if cfg.phases.world_model_head is None else "world_model_head")
    imagined = ["environment=world_model", override("environment.checkpoint", world_model_dir)] \
        if cfg.phases.world_model is not None else []
    # with a calibrate phase, RL reads the success threshold it chose for the imitation policy
    calibrated = [override("environment.calibration", root / "calibrate")] if cfg.phases.calibrate is not None else []
    wiring = {
        "collect": (task, None, None),
        "stage0": (task + algo + [override("run_dir", root / "stage0")], root / "stage0", None),
        "stage1": (task + algo + [override("run_dir", root / "stage1"),
                                  override("stage0_checkpoint", root / "stage0")], root / "stage1", None),
        "finetune": (task + algo + [override("run_dir", root / "finetune"),
                                    override("checkpoint", cfg.base_checkpoint)], root / "finetune", None),
        "flow": (task + algo + [override("run_dir", root / "flow")], root / "flow", None),
        "eval": (family + [override("checkpoint", start), override("out_dir", root / "eval"), "overwrite=true"], None,
                 root / "eval"),
        "world_model": (task + [override("run_dir", root / "world_model")], root / "world_model", None),
        "world_model_head": ([override("checkpoint", root / "world_model"), override("run_dir", world_model_dir)],
                             world_model_dir, None),
        "calibrate": (family + imagined + [override("checkpoint", start), override("calibrate_against", root / "eval"),
                                           override("out_dir", root / "calibrate"), "overwrite=true"], None,
                      root / "calibrate"),
        "rl": (family + imagined + calibrated + [override("checkpoint", start), override("run_dir", root / "rl")],
               root / "rl", None),
        "eval_rl": (family + [override("checkpoint", root / "rl"), override("out_dir", root / "eval_rl"),
                              "overwrite=true"], None, root / "eval_rl"),
    }
    world_model = (world_model_dir,) if imagined else ()
    reads = {"stage1": (root / "stage0",), "eval": (imitation,), "rl": (imitation, *world_model),
             "world_model_head": (root / "world_model",),
             "calibrate": (imitation, *world_model, root / "eval"), "eval_rl": (root / "rl",)}
    if calibrated:
        reads["rl"] += (root / "calibrate",)
    phases = []
    for name in PHASES:
        settings = cfg.phases[name]
        if settings is None:
            continue
        wired, run_dir, out_dir = wiring[name]
        phases.append(Phase(name, JOBS[name], wired + leaf_overrides("", to_dict(settings)), run_dir, out_dir,
                            reads=reads.get(name, ())))
    return phases


def check(cfg, phases: list[Phase]) -> None:
    """Compose every phase's job config before the first one starts (a bad key or value in any phase is one
    line now, not an error an hour in) and note where each training phase ends."""
    if not phases:
        raise RiptError(f"protocol {cfg.name}: every phase is null; nothing to run")
    names = [p.name for p in phases]
    for name, needed in NEEDS.items():
        missing = [n for n in needed if name in names and n not in names]
        if missing:
            raise RiptError(f"protocol {cfg.name}: phases.{name} reads the {missing[0]} phase's output; it is null")
    if "finetune" in names:
        if not cfg.base_checkpoint:
            raise RiptError(f"protocol {cfg.name}: phases.finetune needs base_checkpoint=<a stage-1 checkpoint>")
        if not Path(cfg.base_checkpoint).exists():
            raise RiptError(f"protocol {cfg.name}: base_checkpoint {cfg.base_checkpoint} does not exist (run its "
                            f"multitask protocol first, or pass base_checkpoint=<a stage-1 checkpoint>)")
    for phase in phases:
        try:
            job_cfg = compose(phase.job, phase.overrides)
        except RiptError as e:
            raise RiptError(f"protocol {cfg.name}: phases.{phase.name}: {e}") from None
        if phase.name in IMITATION and cfg.evaluate == "best" and int(job_cfg.eval.every) <= 0:
            raise RiptError(f"protocol {cfg.name}: evaluate=best needs phases.{phase.name}.eval.every > 0 "
                            f"(the training run evaluates and keeps its best step)")
        if phase.name == "rl":
            phase.last_step = int(job_cfg.rl.iterations)
            phase.env_step_budget = int(job_cfg.rl.max_env_steps) if job_cfg.rl.max_env_steps else None
        elif phase.name in TRAINING:
            phase.last_step = int(job_cfg.train.steps)
            phase.batch_size = int(job_cfg.train.batch_size)


def set_aside_evaluations(phases: list[Phase], phase: Phase, state: dict, reached: int) -> None:
    """Before RL goes on from iteration ``reached``: the finished phases that read its folder (the evaluation after
    RL) are to run again, and their results move to ``<folder>_iteration<reached>`` rather than being overwritten."""
    for later in phases:
        if phase.run_dir not in later.reads or later.name not in state["phases"]:
            continue
        if later.out_dir is not None and later.out_dir.exists():
            kept = later.out_dir.with_name(f"{later.out_dir.name}_iteration{reached}")
            if kept.exists():
                raise RiptError(f"protocol: {later.out_dir} is to be kept as {kept}, which exists; move one away")
            later.out_dir.rename(kept)
            log.info("protocol: the evaluation of RL's iteration %d is kept in %s", reached, kept)
        del state["phases"][later.name]


def continue_rl(root: Path, phases: list[Phase], phase: Phase, state: dict, reached: int) -> None:
    """Reopen a finished RL phase asked for more iterations: its time so far carries over to the phase's record."""
    if phase.run_dir is None or not phase.run_dir.exists():
        raise RiptError(f"protocol: phase rl is recorded as finished at iteration {reached}, but its folder "
                        f"{phase.run_dir} is gone, so it cannot go on to iteration {phase.last_step}")
    set_aside_evaluations(phases, phase, state, reached)
    record = state["phases"].pop(phase.name)
    state.setdefault("cut", {})[phase.name] = record["seconds"]
    atomic_write_text(root / STATE_FILE, json.dumps(state, indent=2))
    log.info("protocol: phase rl finished at iteration %d; going on to iteration %d", reached, phase.last_step)


def run_phase(phase: Phase, ranks: int) -> None:
    """Run the phase's job as a child process that ends with this one (a signal to the protocol reaches it, and
    the protocol ends only after it)."""
    command = phase.command(ranks)
    if phase.run_dir is not None and phase.run_dir.exists():
        command.append("resume=true")  # a try cut short: go on from its last checkpoint (or start over if none)
    try:
        code = run_child(command, env={PHASE_OF: "protocol"})  # its Ctrl-C line leaves the advice to us
    except SystemExit:
        log.info("protocol: stopped by a signal during phase %s, after its job ended; the same command continues "
                 "from this phase", phase.name)
        raise
    if code != 0:
        raise RiptError(f"phase {phase.name} (`ript {phase.cli_name}`) failed with exit code {code}; its error is "
                        f"above; the same command continues from this phase")


def cut_short(phase: Phase, step: int) -> bool:
    """Did the phase's own time limit stop it at ``step``? An RL run whose env-step budget is spent is finished
    before its last iteration (its rl_history.json records the env steps counted so far)."""
    if phase.last_step is None or step >= phase.last_step:
        return False
    if phase.env_step_budget is None:
        return True
    from ript.rl.history import recorded_env_steps

    return recorded_env_steps(phase.run_dir) < phase.env_step_budget


def reached_step(run_dir: Path) -> int:
    from ript.utils.checkpoint import resolve_checkpoint_dir

    return int(resolve_checkpoint_dir(run_dir).name)


def gpu_count(setting) -> int:
    if setting != "auto":
        return int(setting)
    import torch

    return max(1, torch.cuda.device_count())


def run(cfg) -> dict[str, Any]:
    setup_console_logging()
    root = Path(cfg.run_root)
    phases = plan(cfg)
    check(cfg, phases)
    gpus = gpu_count(cfg.gpus)
    with holding(root, "run_root"):  # one protocol per run root, checked writable before the first phase
        return run_phases(cfg, phases, gpus)


def run_phases(cfg, phases: list[Phase], gpus: int) -> dict[str, Any]:
    """Each phase not finished yet, in order, recording each one as it finishes; the summary at the end."""
    root = Path(cfg.run_root)
    state = read_state(root)
    # a finished phase's folder must still be there if the summary or a phase still to run reads it: an
    # evaluation's results, or the checkpoint RL starts from (a run carried to another host without the others)
    needed = {p.out_dir for p in phases if p.out_dir is not None}
    needed |= {d for p in phases if p.name not in state["phases"] for d in p.reads}
    for i, phase in enumerate(phases, 1):
        record = state["phases"].get(phase.name)
        differs, reached = (None, None) if record is None else finished_difference(phase, record)
        if reached is not None:
            continue_rl(root, phases, phase, state, reached)
            record = None
        if record is not None:
            if differs is not None:
                raise RiptError(f"protocol {cfg.name}: phase {phase.name} finished in {root} {differs}; "
                                f"choose another run_root, or delete {root / STATE_FILE} and that phase's folder")
            gone = next((d for d in (phase.run_dir, phase.out_dir) if d in needed and not d.exists()), None)
            if gone is not None:
                raise RiptError(f"protocol {cfg.name}: phase {phase.name} is recorded as finished in "
                                f"{root / STATE_FILE}, but its folder {gone} is gone; to run it again, delete its "
                                f"record (and the later phases') from that file, or choose another run_root")
            log.info("protocol %s: phase %s finished earlier (%.1f min), skipping", cfg.name, phase.name,
                     record["seconds"] / 60)
            continue
        log.info("protocol %s: phase %d/%d, %s", cfg.name, i, len(phases), phase.name)
        ranks = phase.ranks(gpus, cfg.min_batch_per_gpu)
        t0 = time.perf_counter()
        run_phase(phase, ranks)
        seconds = round(time.perf_counter() - t0, 1) + state.get("cut", {}).pop(phase.name, 0.0)
        record = {"overrides": phase.overrides, "seconds": seconds, "gpus": ranks}
        if phase.run_dir is not None:
            record["step"] = reached_step(phase.run_dir)
            if cut_short(phase, record["step"]):
                state.setdefault("cut", {})[phase.name] = seconds
                atomic_write_text(root / STATE_FILE, json.dumps(state, indent=2))
                log.info("protocol %s: %s stopped at step %d of %d (its time limit); run the same command again "
                         "to continue", cfg.name, phase.name, record["step"], phase.last_step)
                return {"protocol": str(cfg.name), "stopped": phase.name, "step": record["step"]}
        state["phases"][phase.name] = record
        atomic_write_text(root / STATE_FILE, json.dumps(state, indent=2))
    results = summarize(cfg, phases, state)
    atomic_write_text(root / "results.json", json.dumps(results, indent=2))
    print(f"\nprotocol {cfg.name} ({cfg.task.name}), {root}\n{protocol_table(results)}")
    return results
