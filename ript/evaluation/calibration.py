"""Reading a world model's success head for one policy: the episodes of the policy's simulator evaluation run again
in the world model from the same initial states, each to the horizon, and the head's threshold chosen at which the
imagined outcomes agree best with the real ones, episode by episode.

An imagined episode's trajectory up to the first step at which the head's probability reaches a threshold does
not depend on the threshold, so one run to the horizon that keeps each episode's peak probability
(``success_peak``) gives its outcome under every threshold: a success exactly when the peak reaches it. The
threshold kept maximises balanced accuracy (the mean of the share of real successes imagined as successes and of
real failures imagined as failures), so that the head's verdicts separate the policy's real successes from its
failures, which RL's rewards need; plain agreement would favour calling every episode a success when most are.

    ript eval checkpoint=<policy> environment=world_model environment.checkpoint=<world model> \\
        calibrate_against=<its simulator evaluation's out_dir> out_dir=<folder>   # writes calibration.json
    ript rl ... environment=world_model environment.checkpoint=<world model> environment.calibration=<folder>
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import binomtest

from ript.envs.worker_env import EpisodeSpec
from ript.errors import RiptError
from ript.utils.logging import log

CALIBRATION_FILE = "calibration.json"
THRESHOLDS = tuple(round(0.02 * i, 2) for i in range(1, 50))  # 0.02 ... 0.98


def simulator_episodes(folder: str | Path, policy: dict[str, Any]) -> list[dict[str, Any]]:
    """The episodes of the simulator evaluation in ``folder`` (``results.json``), which must have evaluated the
    same policy: ``policy``'s ``checkpoint`` (and ``adapter``, where one is loaded) as an evaluation records them."""
    path = Path(folder) / "results.json"
    try:
        results = json.loads(path.read_text())
    except FileNotFoundError:
        raise RiptError(f"calibrate_against={folder}: no {path.name} there (a `ript eval` out_dir)") from None
    except json.JSONDecodeError as e:
        raise RiptError(f"calibrate_against={folder}: {path} is not valid JSON ({e})") from None
    if (results.get("environment") or {}).get("name", "simulator") != "simulator":
        raise RiptError(f"calibrate_against={folder}: its episodes ran in {results['environment']['name']}, "
                        f"not the simulator")
    for key in ("checkpoint", "adapter"):
        ours, theirs = policy.get(key), results.get(key)
        if (ours or theirs) and (not ours or not theirs or Path(str(ours)).resolve() != Path(str(theirs)).resolve()):
            raise RiptError(f"calibrate_against={folder} evaluated {key} {theirs}, not {ours}")
    episodes = results.get("episodes") or []
    if not episodes:
        raise RiptError(f"calibrate_against={folder}: {path} lists no episodes")
    return episodes


def episode_specs(episodes: list[dict[str, Any]]) -> list[EpisodeSpec]:
    """The same episodes (task, initial state, index: the same policy-noise stream) to run again."""
    return [EpisodeSpec(e["task"], int(e["seed"]), int(e["episode"])) for e in episodes]


def calibrate(real: list[dict[str, Any]], imagined: list[dict[str, Any]]) -> dict[str, Any]:
    """The threshold whose imagined outcomes best separate ``real``'s successes from its failures, its curve, and
    each task's real and imagined success at it."""
    peaks = {(e["task"], e["seed"], e["episode"]): float(e["success_peak"]) for e in imagined}
    keys = [(e["task"], int(e["seed"]), int(e["episode"])) for e in real]
    missing = [k for k in keys if k not in peaks]
    if missing:
        raise RiptError(f"the imagined run has no episode {missing[0]} of the simulator evaluation")
    won = np.array([bool(e["success"]) for e in real])
    peak = np.array([peaks[k] for k in keys])
    curve, best = threshold_scan(peak, won)
    real_rate = float(won.mean())
    task_of = np.array([k[0] for k in keys])
    tasks = sorted(set(task_of))
    per_task = {t: {**task_row(peak[task_of == t] >= best["threshold"], won[task_of == t]),
                    **own_threshold(peak[task_of == t], won[task_of == t])} for t in tasks}
    # tasks the policy solves for real but never in imagination at any threshold: RL in this world model gets no
    # reward there, and its updates from the other tasks move them unchecked
    unseen = [t for t in tasks if per_task[t]["real"] > 0 and peak[task_of == t].max() < THRESHOLDS[0]]
    rates = np.array([[v["real"], v["imagined"]] for v in per_task.values()])
    spread = len(tasks) > 1 and rates[:, 0].std() > 0 and rates[:, 1].std() > 0
    starts = [(k[0], k[1]) for k in keys]
    return {"threshold": best["threshold"], "balanced_accuracy": best["balanced_accuracy"],
            "agreement": best["agreement"], "real_success": real_rate, "imagined_success": best["imagined_success"],
            "episodes": len(keys), "per_task": per_task, "tasks_never_imagined_successful": unseen,
            "per_task_pearson": float(np.corrcoef(rates.T)[0, 1]) if spread else None,
            "same_start": same_start(starts, won, peak >= best["threshold"], peak), "curve": curve}


def same_start(starts: list[tuple], won: np.ndarray, imagined: np.ndarray, peak: np.ndarray) -> dict | None:
    """What episodes from one start (an evaluation's ``draws_per_layout``) tell, None without any. The simulator
    against itself: each episode's outcome read as another's from its start, the balanced accuracy a world model
    reaches that is right about each start's odds and knows nothing of the actions (its closed-loop episodes draw
    their own futures); above it, the model's outcomes follow the actions. Within a start, what RL's group
    advantages read: of the pairs that ended differently in the simulator, those the model's outcomes at the kept
    threshold put in the same order, the other order, or tie (``order_score``: (same - other) / pairs), and those
    its head's peaks put in the same or the other order (``peak_order_auc``, equal peaks half, 0.5 without signal),
    with the one-sided sign test of the peaks' order (``order_p_value``): at a threshold most pairs tie, and the
    peaks told the quickstart's model, in which RL gained, from the ones in which it did not."""
    groups: dict[tuple, list[int]] = {}
    for i, start in enumerate(starts):
        groups.setdefault(start, []).append(i)
    groups = {k: v for k, v in groups.items() if len(v) > 1}
    if not groups:
        return None
    truth, read, pairs = [], [], []
    for members in groups.values():
        for i in members:
            for j in members:
                if i != j:
                    truth.append(won[i]), read.append(won[j])
                    if won[i] and not won[j]:  # each differing pair once, its winner first
                        pairs.append((i, j))
    simulator = threshold_row(0.0, np.array(read, bool), np.array(truth, bool))["balanced_accuracy"]
    same = sum(bool(imagined[i] and not imagined[j]) for i, j in pairs)
    other = sum(bool(imagined[j] and not imagined[i]) for i, j in pairs)
    higher = sum(bool(peak[i] > peak[j]) for i, j in pairs)
    lower = sum(bool(peak[i] < peak[j]) for i, j in pairs)
    # how likely the peaks put so many pairs in the simulator's order, were their order a coin's
    chance = float(binomtest(higher, higher + lower, 0.5, alternative="greater").pvalue) if higher + lower else 1.0
    n = len(pairs)
    return {"starts": len(groups), "episodes": sum(map(len, groups.values())),
            "simulator_balanced_accuracy": simulator, "pairs_ended_differently": n, "ordered_as_simulator": same,
            "ordered_otherwise": other, "tied": n - same - other, "order_score": (same - other) / n if n else None,
            "peaks_ordered_as_simulator": higher, "peaks_ordered_otherwise": lower,
            "peak_order_auc": (higher + 0.5 * (n - higher - lower)) / n if n else None, "order_p_value": chance}


def task_row(imagined: np.ndarray, won: np.ndarray) -> dict[str, float]:
    """One task's real and imagined success at the kept threshold, how well its imagined outcomes told its real
    successes from its failures, and the counts that pool tasks into one balanced accuracy
    (``pooled_balanced_accuracy``)."""
    counts = {"real_successes": int(won.sum()), "successes_imagined": int((imagined & won).sum()),
              "real_failures": int((~won).sum()), "failures_imagined": int((imagined & ~won).sum())}
    return {"real": float(won.mean()), "imagined": float(imagined.mean()),
            "balanced_accuracy": pooled_balanced_accuracy([counts]), "episodes": int(len(won)), **counts}


def own_threshold(peak: np.ndarray, won: np.ndarray) -> dict[str, float]:
    """The threshold that would best separate one task's episodes alone, and how well: fitted on the episodes it
    is scored on, an upper bound, which tells a head that cannot tell them apart at any threshold from one whose
    threshold is shared with the other tasks."""
    _, best = threshold_scan(peak, won)
    return {"own_threshold": best["threshold"], "own_balanced_accuracy": best["balanced_accuracy"]}


def pooled_balanced_accuracy(rows: list[dict[str, float]]) -> float:
    """The balanced accuracy of several tasks' episodes together, from their ``task_row`` counts."""
    successes, failures = (sum(int(r[k]) for r in rows) for k in ("real_successes", "real_failures"))
    parts = ([sum(int(r["successes_imagined"]) for r in rows) / successes] if successes else []) \
        + ([1 - sum(int(r["failures_imagined"]) for r in rows) / failures] if failures else [])
    return float(np.mean(parts)) if parts else 0.0


def threshold_scan(peak: np.ndarray, won: np.ndarray) -> tuple[list[dict[str, float]], dict[str, float]]:
    """Every threshold's row for episodes whose head peaked at ``peak`` and really succeeded where ``won``, and the
    row of best balanced accuracy; ties (e.g. a head that never separates them) go to the imagined success nearest
    the real one, then to the lower threshold."""
    curve = [threshold_row(t, peak >= t, won) for t in THRESHOLDS]
    real_rate = float(won.mean())
    best = max(curve, key=lambda r: (round(r["balanced_accuracy"], 9), -abs(r["imagined_success"] - real_rate),
                                     -r["threshold"]))
    return curve, best


def threshold_row(threshold: float, imagined: np.ndarray, won: np.ndarray) -> dict[str, float]:
    hit = float(imagined[won].mean()) if won.any() else 0.0
    rejected = float((~imagined[~won]).mean()) if (~won).any() else 0.0
    parts = [hit] * bool(won.any()) + [rejected] * bool((~won).any())
    return {"threshold": threshold, "imagined_success": float(imagined.mean()), "real_successes_imagined": hit,
            "real_failures_imagined": rejected, "balanced_accuracy": float(np.mean(parts)),
            "agreement": float((imagined == won).mean())}


def read_calibration(folder: str | Path) -> dict[str, Any]:
    """``calibration.json`` in ``folder``; missing or unreadable is a RiptError naming it."""
    path = Path(folder) / CALIBRATION_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise RiptError(f"environment.calibration={folder}: no {CALIBRATION_FILE} there (`ript eval "
                        f"calibrate_against=...` writes it)") from None
    except json.JSONDecodeError as e:
        raise RiptError(f"environment.calibration={folder}: {path} is not valid JSON ({e})") from None


def calibrated_threshold(folder: str | Path, world_model: Path) -> float:
    """The threshold ``calibration.json`` in ``folder`` chose, refused unless it was measured for ``world_model``
    (a world-model checkpoint's step folder)."""
    found = read_calibration(folder)
    if Path(found.get("world_model", "")).resolve() != Path(world_model).resolve():
        raise RiptError(f"environment.calibration={folder} was measured in world model {found.get('world_model')}, "
                        f"not {world_model}")
    return float(found["threshold"])


def check_rewards_follow_simulator(env) -> set[str] | None:
    """RL in a world model whose calibration found the head's verdicts no better than ``min_calibrated_accuracy``
    at telling the policy's real successes from its failures is refused: its rewards would not follow the
    simulator's, and RL learns whatever the model draws as success (LIBERO-Object lost 5.8 points so,
    docs/world_model.md). With ``min_task_calibrated_accuracy`` RL keeps only the tasks whose own episodes passed
    it (returned; None: every task), and the gate above reads those tasks' episodes together: RL past the gate
    gained on the tasks whose imagined outcomes matched the simulator's and lost up to 68 points on the others. A
    world model without a calibration is not checked."""
    if env.name != "world_model" or not env.get("calibration"):
        if env.get("min_task_calibrated_accuracy"):
            raise RiptError(f"environment.min_task_calibrated_accuracy={env.min_task_calibrated_accuracy:g} reads a "
                            f"world model's calibration: set environment=world_model and environment.calibration")
        return None
    found = read_calibration(env.calibration)
    kept = calibrated_tasks(env, found) if env.get("min_task_calibrated_accuracy") else None
    accuracy = float(found["balanced_accuracy"]) if kept is None \
        else pooled_balanced_accuracy([found["per_task"][t] for t in kept])
    over = "" if kept is None else f" over the {len(kept)} task(s) kept"
    if env.min_calibrated_accuracy and accuracy < float(env.min_calibrated_accuracy):
        raise RiptError(f"environment.calibration={env.calibration}: the head told the policy's real successes from "
                        f"its failures at balanced accuracy {accuracy:.1%}{over}, below environment."
                        f"min_calibrated_accuracy={env.min_calibrated_accuracy:g}; rewards in this world model do not "
                        f"follow the simulator's (train it longer or on the policy's episodes; "
                        f"min_calibrated_accuracy=0 runs RL anyway)")
    check_order_within_starts(env, found)
    return kept


def check_order_within_starts(env, found: dict[str, Any]) -> None:
    """RL's advantages compare the episodes of one start: a world model whose head's peaks do not put the episodes
    that ended differently in the simulator in the simulator's order more often than a coin would (one-sided sign
    test above ``max_order_p_value``) gives RL updates that do not follow the simulator's, whatever its balanced
    accuracy over starts (MetaWorld pick-place: 58.3%, peaks ordering 47 pairs as the simulator and 44 the other
    way, and RL in it gained nothing; the quickstart's model, in which RL gained: 33 against 15). A calibration
    without episodes from one start (``draws_per_layout``) cannot tell, and is said so."""
    order = found.get("same_start")
    limit = float(env.max_order_p_value)
    if limit >= 1.0:
        return
    if not order or not order["pairs_ended_differently"]:
        log.info("environment.calibration=%s has no start whose simulator episodes ended differently (evaluate "
                 "with draws_per_layout=2 or more): whether the world model orders them is not checked",
                 env.calibration)
        return
    if order["order_p_value"] > limit:
        o = order
        raise RiptError(f"environment.calibration={env.calibration}: of the {o['pairs_ended_differently']} pairs of "
                        f"episodes from one start that ended differently in the simulator, the world model's success "
                        f"peaks put {o['peaks_ordered_as_simulator']} in the simulator's order and "
                        f"{o['peaks_ordered_otherwise']} in the other (sign test p={o['order_p_value']:.2f}, above "
                        f"environment.max_order_p_value={limit:g}): RL's advantages in it do not follow the "
                        f"simulator's (max_order_p_value=1 runs RL anyway)")


def calibrated_tasks(env, found: dict[str, Any]) -> set[str]:
    """The tasks whose own calibrated balanced accuracy reaches ``env.min_task_calibrated_accuracy``; none is a
    RiptError naming the best, and so is a calibration written without the per-task figures."""
    floor, per_task = float(env.min_task_calibrated_accuracy), found.get("per_task") or {}
    if not per_task or any("balanced_accuracy" not in row for row in per_task.values()):
        raise RiptError(f"environment.calibration={env.calibration}: its {CALIBRATION_FILE} has no per-task balanced "
                        f"accuracy, which environment.min_task_calibrated_accuracy reads (calibrate again)")
    kept = {t for t, row in per_task.items() if float(row["balanced_accuracy"]) >= floor}
    if not kept:
        best = max(per_task, key=lambda t: per_task[t]["balanced_accuracy"])
        raise RiptError(f"environment.calibration={env.calibration}: no task reaches environment."
                        f"min_task_calibrated_accuracy={floor:g} (the best: {best}, "
                        f"{per_task[best]['balanced_accuracy']:.1%})")
    left = ", ".join(f"{t} ({per_task[t]['balanced_accuracy']:.0%})" for t in sorted(set(per_task) - kept))
    log.info("RL in the world model on the %d of %d task(s) whose calibration reached %g%s", len(kept), len(per_task),
             floor, f"; left out: {left}" if left else "")
    return kept


def calibration_line(c: dict[str, Any]) -> str:
    unseen = c.get("tasks_never_imagined_successful") or []
    blind = (f"; the head stayed below {THRESHOLDS[0]:g} in every imagined episode of {len(unseen)} task(s) the policy "
             f"solves ({', '.join(unseen)}): RL gets no reward there" if unseen else "")
    # at chance no threshold tells the policy's real successes from its failures: the one kept is only the tie-break's
    chance = (f"; no threshold separates the real successes from the failures (at chance), so {c['threshold']:g} "
              f"is only the tie-break's choice" if c["balanced_accuracy"] <= 0.5 else "")
    return (f"success head calibrated on {c['episodes']} simulator episodes: threshold {c['threshold']:g}, balanced "
            f"accuracy {c['balanced_accuracy']:.1%}, agreement {c['agreement']:.1%}; success real "
            f"{c['real_success']:.1%}, imagined {c['imagined_success']:.1%}{chance}{blind}{same_start_words(c)}")


def same_start_words(c: dict[str, Any]) -> str:
    s = c.get("same_start")
    if not s:
        return ""
    order = (f"; of the {s['pairs_ended_differently']} pairs from one start that ended differently, the model put "
             f"{s['ordered_as_simulator']} in the simulator's order, {s['ordered_otherwise']} in the other and tied "
             f"{s['tied']}, its success peaks {s['peaks_ordered_as_simulator']} in the simulator's order and "
             f"{s['peaks_ordered_otherwise']} in the other (sign test p={s['order_p_value']:.2g})"
             if s["pairs_ended_differently"] else "; no start ended differently in the simulator")
    return (f"; the simulator against itself from the same {s['starts']} starts: balanced accuracy "
            f"{s['simulator_balanced_accuracy']:.1%}{order}")


def calibration_table(c: dict[str, Any]) -> str:
    """Each task's real and imagined success at the kept threshold, how well its imagined outcomes told its real
    successes from its failures (what ``environment.min_task_calibrated_accuracy`` reads), and how well they would
    at the task's own best threshold."""
    rows = [f"{'task':<34}{'real':>8}{'imagined':>10}{'balanced acc':>14}{'at its own threshold':>24}"]
    for task, r in sorted(c["per_task"].items()):
        own = f"{r['own_balanced_accuracy']:.1%} at {r['own_threshold']:g}"
        rows.append(f"{task:<34}{r['real']:>8.1%}{r['imagined']:>10.1%}{r['balanced_accuracy']:>14.1%}{own:>24}")
    return "\n".join(rows)
