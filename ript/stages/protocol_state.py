"""What ``<run_root>/protocol.json`` records of a protocol's finished phases, read back and checked, and how a
finished phase differs from the one asked for now (a ``Phase`` of ``ript.stages.protocol``: its name, overrides
and last step), which decides whether the same command skips it, refuses it or lets RL go on."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from ript.errors import RiptError
from ript.utils.run_dir import RUN_CONTROL_KEYS, covered, predates

STATE_FILE = "protocol.json"
# see result_settings; a finished RL phase asked for more iterations goes on from its last one
# (``finished_difference``), and a training phase whose in-training evaluation changed is refused, not skipped
# (it chooses checkpoints/best, which evaluate=best starts from)
DRIVING_KEYS = tuple(k for k in RUN_CONTROL_KEYS if k not in ("rl.iterations", "eval")) + ("num_workers",
                                                                                          "episodes_per_job")


def read_state(root: Path) -> dict[str, Any]:
    path = root / STATE_FILE
    if not path.exists():
        return {"phases": {}}
    try:
        state = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise RiptError(f"cannot read {path}: {e}; move it away to start the protocol over") from None
    problem = state_problem(state)
    if problem is not None:
        raise RiptError(f"{path}: {problem}; restore it or move it away to start the protocol over")
    return state


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def state_problem(state: Any) -> str | None:
    """What makes a (hand-edited) protocol.json unusable, or None: the run reads each record's overrides,
    seconds and step, and the seconds of phases cut short."""
    if not isinstance(state, dict) or not isinstance(state.get("phases"), dict):
        return "not a protocol record (expected an object with a 'phases' object)"
    for name, record in state["phases"].items():
        where = f"phases.{name}"
        if not isinstance(record, dict):
            return f"{where} is {type(record).__name__}, not an object"
        overrides = record.get("overrides")
        if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
            return f"{where}.overrides is missing or not a list of strings"
        if not _number(record.get("seconds")):
            return f"{where}.seconds={record.get('seconds')!r} is not a number"
        if "step" in record and not (isinstance(record["step"], int) and not isinstance(record["step"], bool)):
            return f"{where}.step={record['step']!r} is not a step number"
    cut = state.get("cut", {})
    if not isinstance(cut, dict) or not all(_number(v) for v in cut.values()):
        return "'cut' is not an object of seconds by phase"
    return None


def override_key(override_text: str) -> str:
    """The key an override sets: ``+phases.rl.lr=1e-4`` -> ``phases.rl.lr``."""
    return override_text.split("=", 1)[0].lstrip("+~")


def result_settings(overrides: list[str]) -> list[str]:
    """The overrides that can change what a phase computes: not how it is driven or reported (the run-control
    keys a resumed job may change, and collection's worker count and job size: demo j is the same however the
    work is split, and so is evaluation's episode j), so that a finished phase is skipped on a host of another
    size or with other progress output."""
    return [o for o in overrides if not covered(override_key(o), DRIVING_KEYS)]


def override_value(text: str) -> Any:
    """An override's value as the protocol writes it (JSON), or its text (a bare word on the command line)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def settings_added_since(now: list[str], done: list[str]) -> set[str]:
    """The overrides asked for now of settings the finished phase predates (``run_dir.predates``): they do not
    make it differ."""
    done_keys = {override_key(o) for o in done}
    now_values = {override_key(o): override_value(o.split("=", 1)[1]) for o in now if "=" in o}
    return {o for o in now if predates(override_key(o), done_keys, now_values)}


def finished_differently(phase, record: dict) -> str | None:
    """How the finished phase's settings differ from those asked for now, said the right way round: a setting
    asked for now that it ran without, or one it ran with that is not asked for now (None: the same settings)."""
    now, done = result_settings(phase.overrides), result_settings(record["overrides"])
    now_set, done_set = set(now), set(done)
    added = settings_added_since(now, done)
    asked = next((o for o in now if o not in done_set and o not in added), None)
    if asked is not None:
        return f"without {asked}"
    had = next((o for o in done if o not in now_set), None)
    return None if had is None else f"with {had}, which this command does not ask for"


def _without_iterations(overrides: list[str]) -> list[str]:
    return [o for o in overrides if override_key(o) != "rl.iterations"]


def finished_difference(phase, record: dict) -> tuple[str | None, int | None]:
    """How a finished phase differs from what is asked now (None: the same), and for an RL phase asked for more
    iterations with every other setting the same, the iteration it reached: it goes on from there (RL's schedule
    does not depend on the count)."""
    count = [o for o in phase.overrides if override_key(o) == "rl.iterations"]
    # a new count (not one an env-step budget ended short of: the same command skips that run)
    more = phase.name == "rl" and phase.last_step is not None and any(o not in record["overrides"] for o in count) \
        and phase.last_step > record.get("step", phase.last_step)
    if not more:
        return finished_differently(phase, record), None
    same = replace(phase, overrides=_without_iterations(phase.overrides))
    differs = finished_differently(same, {**record, "overrides": _without_iterations(record["overrides"])})
    return differs, None if differs is not None else int(record["step"])
