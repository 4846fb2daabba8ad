"""Run folders: created only once a stage's inputs are checked, never started over, resumed only with the
config that wrote them.

A stage calls ``prepare_run_dir(cfg, create=False)`` first (fails fast on an existing run, finds the
checkpoint to resume, compares configs), loads and checks its inputs, then ``prepare_run_dir(cfg)`` to create
the folder. A folder left by a start that failed before its first checkpoint holds no checkpoint; resume=true
starts it over.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ript.errors import RiptError
from ript.utils.atomic import atomic_write_text
from ript.utils.checkpoint import read_checkpoint_config, remove_partial_checkpoints, resolve_checkpoint_dir
from ript.utils.containers import to_dict
from ript.utils.locking import LOCK_FILE, hold_folder
from ript.utils.logging import log

# Keys that change how a run is driven or reported, not what it computes: a resumed run may change them.
RUN_CONTROL_KEYS = (
    "resume", "resume_allow_changes", "resume_fewer_ranks", "run_dir", "progress", "device", "logger", "workers",
    "placement", "eval",
    "train.stop_after_minutes", "rl.stop_after_minutes", "train.log_every", "train.val_every",
    "train.save_every", "train.keep_last", "keep_last", "rl.num_workers", "cuda_graph",
    "train.compile", "train.cuda_graphs", "train.channels_last", "train.tf32", "train.cudnn_benchmark",
    "train.deterministic", "compile_cache",  # how, not what, is computed
    "rl.compile", "rl.compile_ahead", "rl.compile_ahead_wait_s", "rl.tf32",  # the RL update's speed and memory knobs
    "rl.channels_last",
    "rl.micro_batch",
    "rl.iterations",  # RL's schedule does not depend on it: more iterations extend the same run
    "environment.min_calibrated_accuracy", "environment.max_order_p_value",  # checked before a run starts
)


# Settings added after runs were made without them, each with the value that computes what those runs computed:
# a run whose stored config lacks the key resumes when the key has this value.
ADDED_SETTINGS = {"train.lr_scaling": "none", "environment.starts": "first_frames", "rl.overlap": False,
                  "rl.kl_coef": 0.0, "rl.task_weighting_prior": False, "algo.image_aug_color": 0.0,
                  "policy.sde_first_steps": None, "rl.target_kl": None, "rl.target_eval_shift": None,
                  "rl.flow_matching_coef": 0.0, "rl.demo_coef": 0.0,
                  "rl.loss_aggregation": "decisions", "train.ema_decay": None, "algo.model.output": "change",
                  "algo.model.denoise_steps": 3, "algo.model.cond_noise": 0.0,
                  "algo.model.state_head": "bottleneck", "algo.state_steps": 0,
                  "algo.model.feed_back": "regressed", "environment.min_task_calibrated_accuracy": 0.0}
# settings meaningless without the added setting they go with
ADDED_ALONG = {"train.lr_reference_batch": "train.lr_scaling", "environment.start_chunks": "environment.starts",
               "rl.demo_batch": "rl.demo_coef"}


def with_added_settings(recorded: dict[str, Any]) -> dict[str, Any]:
    """A run's recorded config with each added setting it lacks at the value that computes what it computed
    (where the section that holds it is there): a config to train again as that run trained."""
    out = json.loads(json.dumps(recorded))
    for key, value in ADDED_SETTINGS.items():
        *parents, name = key.split(".")
        section = out
        for part in parents:
            section = section.get(part) if isinstance(section, dict) else None
        if isinstance(section, dict) and name not in section:
            section[name] = value
    return out


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def covered(key: str, keys: tuple[str, ...]) -> bool:
    """Is ``key`` one of ``keys`` or inside one of them (``train.lr`` is inside ``train``)?"""
    return any(key == k or key.startswith(k + ".") for k in keys)


def predates(key: str, old_keys, new_values: dict[str, Any]) -> bool:
    """Is ``key`` (absent from a run's ``old_keys``) a setting added after that run, or one going along with such,
    whose added setting is now at the value that computes what the run computed?"""
    partner = ADDED_ALONG.get(key, key)
    return key not in old_keys and partner in ADDED_SETTINGS and partner not in old_keys \
        and partner in new_values and new_values[partner] == ADDED_SETTINGS[partner]


def changed_keys(stored: dict, new: dict, allowed: tuple[str, ...]) -> list[tuple[str, Any, Any]]:
    """(key, stored value, new value) for every key that differs and that ``allowed`` does not cover."""
    old, cur = flatten(stored), flatten(new)
    missing = object()
    out = []
    for key in sorted(set(old) | set(cur)):
        a, b = old.get(key, missing), cur.get(key, missing)
        if predates(key, old, cur):
            continue  # a setting the stored run predates, at the value that reproduces it
        if a != b and not covered(key, allowed):
            out.append((key, None if a is missing else a, None if b is missing else b))
    return out


def check_resume_config(cfg: dict, ckpt: Path) -> None:
    stored = read_checkpoint_config(ckpt).get("cfg")
    if stored is None:
        return
    allowed = RUN_CONTROL_KEYS + tuple(str(k) for k in cfg.get("resume_allow_changes") or [])
    diffs = changed_keys(stored, cfg, allowed)
    if diffs:
        key, a, b = diffs[0]
        more = f" (and {len(diffs) - 1} more: {', '.join(k for k, _, _ in diffs[1:4])})" if len(diffs) > 1 else ""
        keys = ",".join(k for k, _, _ in diffs)
        raise RiptError(f"resume: {ckpt} was trained with {key}={a!r}, this run has {key}={b!r}{more}; "
                        f"resuming would not reproduce the run. Pass resume_allow_changes=[{keys}] to continue anyway")


def prepare_run_dir(cfg, create: bool = True) -> tuple[Path, Path | None]:
    """(run dir, checkpoint to resume or None). ``create=False`` only checks; ``create=True`` also creates the
    folder and writes its config.json (or, resuming, clears what a killed save left)."""
    run_dir = Path(cfg.run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RiptError(f"run_dir {run_dir} is a file, not a folder; choose another run_dir")
    # One writer per run folder (under torchrun, rank 0 holds it for all ranks): a resumed one is taken before the
    # checkpoint to resume is chosen, so that a second writer ends before it loads anything.
    lock = os.environ.get("RANK", "0") == "0"
    if lock and (cfg.resume or create) and run_dir.is_dir():
        hold_folder(run_dir, "run_dir")
    last = run_dir / "checkpoints" / "last"
    if cfg.resume and last.is_symlink() and not last.exists():
        raise RiptError(f"{last} points to a missing checkpoint ({last.readlink()}); "
                        f"point it at an existing step folder to resume")
    if cfg.resume and last.exists():
        ckpt = resolve_checkpoint_dir(run_dir)
        check_resume_config(to_dict(cfg), ckpt)
        if create:
            remove_partial_checkpoints(run_dir)
        return run_dir, ckpt
    if cfg.resume:
        if not run_dir.is_dir():
            raise RiptError(f"resume=true but run_dir {run_dir} does not exist; drop resume=true to start it")
        steps = [p for p in (run_dir / "checkpoints").glob("[0-9]*")] if (run_dir / "checkpoints").is_dir() else []
        if steps:
            raise RiptError(f"resume=true but {last} is missing while {run_dir}/checkpoints has step folders; "
                            f"link last to one of them (ln -s <step> {last})")
        if create:
            log.info("%s holds no checkpoint (an earlier start failed before its first one): starting it over", run_dir)
    elif run_dir.exists() and any(p.name != LOCK_FILE for p in run_dir.iterdir()):
        raise RiptError(f"run_dir {run_dir} already exists; pass resume=true to continue it or choose another run_dir")
    if create:
        if lock:
            hold_folder(run_dir, "run_dir")  # a fresh run that another one began meanwhile ends here
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_dir / "config.json", json.dumps(to_dict(cfg), indent=2))
    return run_dir, None


def prepare_ranked_run_dir(cfg, info) -> tuple[Path, Path | None]:
    """``prepare_run_dir`` under torchrun: every rank checks (and finds the checkpoint to resume), then rank 0
    alone creates the folder while the others wait."""
    from ript.utils import distributed as ddist

    run_dir, resume_from = prepare_run_dir(cfg, create=False)
    ddist.barrier(info)
    if info.is_main:
        prepare_run_dir(cfg)
    ddist.barrier(info)
    return run_dir, resume_from
