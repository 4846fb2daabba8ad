"""A LIBERO task's BDDL goal as one scripted expert: its (On X Y) / (In X Y) placements and (Open X) / (Close X)
/ (TurnOn X) / (TurnOff X) articulations, each given the skill it needs (``pick_place`` and the modules
beside it) and worked in an order that keeps the later ones possible."""

from __future__ import annotations

import re

from ript.errors import RiptError
from ript.experts.base import SequenceExpert
from ript.experts.libero.articulated import SlideOpenExpert, articulated_expert
from ript.experts.libero.drag import DragExpert, drags
from ript.experts.libero.fit import region_spot
from ript.experts.libero.joints import closed_container, drawer_body
from ript.experts.libero.pick_place import HURRIED_CLEARANCE, PickPlaceExpert
from ript.experts.libero.set_aside import push_back, set_aside
from ript.experts.libero.slanted import DrawerLayExpert, SlantedPlaceExpert, is_slanted, too_tall_for
from ript.experts.libero.slide_in import slide_in_steps


def goal_predicates(bddl_file: str) -> list[tuple[str, ...]]:
    """The ``(:goal (And (Pred a b) ...))`` clauses of a BDDL problem, lower-cased."""
    with open(bddl_file) as f:
        text = f.read()
    start = text.find("(:goal")
    if start < 0:
        raise RiptError(f"{bddl_file}: no (:goal ...) section")
    return [tuple(m.lower().split()) for m in re.findall(r"\(([A-Za-z]+(?:\s+[A-Za-z0-9_]+)+)\)", text[start:])]


# the order goals are worked in, whatever the BDDL lists first: open a container before putting things in, turn
# a knob before a pot may hide it, close a drawer once its contents are in (a close nothing goes into comes first:
# the hand on its way to a bottom drawer would push an opened top drawer shut again)
GOAL_ORDER = {"open": 0, "turnon": 1, "turnoff": 1, "on": 2, "in": 2, "close": 3}
FIRST = -1


def _clear_drawer_paths(task, steps: list) -> list:
    """Each drawer opening preceded by moving out of its way the objects picked after it (an open drawer
    hangs over what lies in front of it, and the hand cannot come down past it)."""

    out = []
    for i, step in enumerate(steps):
        if isinstance(step, SlideOpenExpert):
            later = [s for s in steps[i + 1:] if isinstance(s, PickPlaceExpert)]
            for pick in later:
                aside = set_aside(task, pick.obj, step)
                if aside is not None:  # three steps in the time of two: each as quick as it safely goes
                    out.append(aside)
                    aside.fast_descent = pick.fast_descent = step.hurried = True
                    pick.clearance = HURRIED_CLEARANCE
        out.append(step)
    return out


def make_expert(task):
    """An expert for a task whose goal is a list of (On X Y) / (In X Y) placements (onto a leaning region:
    ``slanted``; a plate onto the table's region: ``drag``) and (Open X) / (Close X) / (TurnOn X) /
    (TurnOff X) articulations, worked in GOAL_ORDER (objects an opening drawer would cover set aside first, a drawer
    open over its object pushed back first: ``set_aside``); other goals have none yet (a one-line error)."""
    import mujoco


    model = task.sim.model._model
    bodies = {mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, b) or "" for b in range(model.nbody)}
    sites = {mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_SITE, i) or "" for i in range(model.nsite)}
    objects = sorted((b[: -len("_main")] for b in bodies if b.endswith("_main")), key=len, reverse=True)
    preds = [p for p in goal_predicates(task.bddl_file) if p[0] != "and"]
    unknown = [p for p in preds if p[0] not in GOAL_ORDER]
    if unknown:
        raise RiptError(f"{task.suite}/{task.task_name}: no scripted expert for the goal ({' '.join(unknown[0])})")
    for pred in list(preds):  # a drawer is opened before anything goes in (the goal lists only the In)
        if pred[0] == "in" and len(pred) == 3 and ("open", pred[2]) not in preds and closed_container(task, pred[2]):
            preds.append(("open", pred[2]))
    steps = []
    filled = [p[2] for p in preds if p[0] in ("on", "in") and len(p) == 3]

    def order(p: tuple[str, ...]) -> int:  # (close microwave_1) is filled by (in mug microwave_1_heating_region)
        if p[0] == "close" and not any(r == p[1] or r.startswith(p[1] + "_") for r in filled):
            return FIRST
        return GOAL_ORDER[p[0]]

    for pred in sorted(preds, key=order):
        if pred[0] not in ("on", "in"):
            steps.append(articulated_expert(task, pred))
            continue
        if len(pred) != 3:
            raise RiptError(f"{task.suite}/{task.task_name}: no scripted expert for the goal ({' '.join(pred)})")
        obj, region = pred[1], pred[2]
        target = next((o for o in objects if region == o or region.startswith(o + "_")), None)
        table_region = target is None and region.endswith("_region") and region in sites
        if obj not in objects or (target is None and not table_region):
            raise RiptError(f"{task.suite}/{task.task_name}: no scripted expert for the goal ({' '.join(pred)})")
        site = None if region == target else region
        if pred[0] == "on" and target is not None and site is not None and is_slanted(task.sim, site):
            steps.append(SlantedPlaceExpert(obj, target, site))  # a wine rack's leaning tray
            continue
        if pred[0] == "on" and table_region and drags(task.sim, obj):
            steps.append(DragExpert(obj, region))  # a plate, along the table
            continue
        surface = drawer_body(task, region)
        if pred[0] == "in" and surface is not None and too_tall_for(task.sim, obj, region):
            steps.append(DrawerLayExpert(obj, target, region))  # a bottle, lying in a shallow drawer
            continue
        sliding = slide_in_steps(task, obj, target, site) if pred[0] == "in" and site and surface is None else None
        if sliding is not None:  # a shelf's layer, a microwave: through the open side, by the handle
            steps.extend(sliding)
            continue
        step = PickPlaceExpert(obj, target, site, surface_body=surface)
        if surface is not None and not closed_container(task, region):  # a drawer open from the start
            steps.extend(s for s in [push_back(task, step)] if s is not None)
        sharing = [p for p in preds if p[0] in ("on", "in") and len(p) == 3 and p[2] == region]
        if site is not None and len(sharing) > 1:
            step.offset = region_spot(task.sim, site, obj, sharing.index(pred), len(sharing))
        steps.append(step)
    if not steps:
        raise RiptError(f"{task.suite}/{task.task_name}: the BDDL goal is empty")
    steps = _clear_drawer_paths(task, steps)
    return steps[0] if len(steps) == 1 else SequenceExpert(steps)
