"""What a protocol reports: each evaluation's per-task success side by side, its decoding, and every phase's time
(printed at the end and written to ``<run_root>/results.json``)."""

from __future__ import annotations

import json
from typing import Any

from ript.evaluation.calibration import calibration_line
from ript.stages.world_model_head import RESULTS_FILE as HEAD_FILE
from ript.stages.world_model_head import measure_line

EVALUATIONS = {"eval": "imitation", "eval_rl": "after RL"}  # the evaluation phases and their columns


def decoding(sampling: dict[str, Any]) -> str:
    """An evaluation's decoding in a table cell: greedy or temperature/top-k, and the actions run per decision (the
    same policy scores differently decoded otherwise)."""
    if "denoise_steps" in sampling:  # a flow policy: the ODE or RL's noise, in K Euler steps
        return f"{'ode' if sampling.get('ode') else 'noisy'} K{sampling['denoise_steps']} h{sampling['action_horizon']}"
    top_k = f" k{sampling['top_k']}" if sampling.get("top_k") else ""
    how = "greedy" if sampling.get("greedy") else f"T{float(sampling['temperature']):g}{top_k}"
    return f"{how} h{sampling['action_horizon']}"


def success_rows(evaluations: dict[str, Any]) -> list[str]:
    """Per-task success of each evaluation side by side, then the averages (none for a protocol that only trains)."""
    if not evaluations:
        return []
    labels = list(evaluations)
    tasks = list(dict.fromkeys(t for e in evaluations.values() for t in e["per_task"]))
    rows = [f"{'task':<40}" + "".join(f"{EVALUATIONS[e]:>12}" for e in labels)]
    for t in tasks:
        cells = [evaluations[e]["per_task"].get(t) for e in labels]
        rows.append(f"{t:<40}" + "".join(f"{c:>12.1%}" if c is not None else f"{'-':>12}" for c in cells))
    rows.append(f"{'average':<40}" + "".join(f"{evaluations[e]['success_rate']:>12.1%}" for e in labels))
    rows.append(f"{'episodes':<40}" + "".join(f"{evaluations[e]['episodes']:>12d}" for e in labels))
    rows.append(f"{'decoding':<40}" + "".join(f"{decoding(evaluations[e]['sampling']):>12}" for e in labels))
    return rows + [""]


def protocol_table(results: dict[str, Any]) -> str:
    rows = success_rows(results["evaluations"])
    for when, measured in results.get("success_head", {}).items():
        rows.append(measure_line(f"success head, held-out imagined chunks, {when}", measured))
    if "calibration" in results:
        rows += [calibration_line(results["calibration"]), ""]
    for name, record in results["phases"].items():
        step = f" (step {record['step']})" if "step" in record else ""
        rows.append(f"{name:<12} {record['seconds'] / 60:>7.1f} min{step}")
    rows.append(f"{'all':<12} {sum(r['seconds'] for r in results['phases'].values()) / 60:>7.1f} min")
    return "\n".join(rows)


def summarize(cfg, phases: list, state: dict) -> dict[str, Any]:
    evaluations, calibration, head = {}, None, None
    for phase in phases:
        if phase.name == "world_model_head":  # the head trained again on the world model's own imagination
            head = json.loads((phase.run_dir / HEAD_FILE).read_text())["held_out"]
        if phase.name == "calibrate":  # the imitation policy's episodes again in the world model, to the horizon
            found = json.loads((phase.out_dir / "calibration.json").read_text())
            calibration = {k: v for k, v in found.items() if k not in ("curve", "per_task")}
        if phase.name not in EVALUATIONS:
            continue
        res = json.loads((phase.out_dir / "results.json").read_text())
        evaluations[phase.name] = {
            "checkpoint": res.get("checkpoint"), "success_rate": res["success_rate"],
            "episodes": sum(int(t["episodes"]) for t in res["per_task"].values()),
            "per_task": {t: v["success_rate"] for t, v in res["per_task"].items()},
            "sampling": res["sampling"]}
    return {"protocol": str(cfg.name), "task": str(cfg.task.name), "evaluations": evaluations,
            **({"success_head": head} if head else {}), **({"calibration": calibration} if calibration else {}),
            "phases": {p.name: state["phases"][p.name] for p in phases}}
