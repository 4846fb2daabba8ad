"""Clearing the way between a drawer and an object that goes into it (a LIBERO expert's first step).

An open drawer can hang over what stands in front of its cabinet, and the hand, coming down on the object, then
stalls on the drawer: before a drawer is opened over the object, the object is set down somewhere clear; a drawer
that is open already is pushed part of the way in, as far as the hand needs.
"""

from __future__ import annotations

import numpy as np

from ript.experts.libero.articulated import SlideOpenExpert
from ript.experts.libero.geometry import (
    HAND_HALF_SPAN,
    HAND_HALF_WIDTH,
    MAX_GRASP_WIDTH,
    ObstacleBoxes,
    collision_corners,
    narrow_direction,
)
from ript.experts.libero.joints import SLIDE, Articulation, joint_for
from ript.experts.libero.pick_place import PickPlaceExpert
from ript.experts.libero.push import JointPushExpert

HAND_ROOM = 0.015  # room left between a drawer pushed back and the hand coming down beside it
DRAWER_ROOM = 0.04  # ... and the least the drawer is left open beyond the object's narrow side
MAX_SET_ASIDE = 0.26  # the farthest an object is moved out of an opening drawer's way (metres)
# setting the bowl aside, opening the drawer and putting the bowl in took 278-283 steps in libero_goal's first three
# demo layouts (313-321 before the fast descent from high above and the drawer's earlier turn-back);
# in a shorter episode reaching in past the open drawer is tried instead
SET_ASIDE_HORIZON = 300


class SetAsideExpert(PickPlaceExpert):
    """Move an object a short way across the table to ``spot`` (low carry, short settle): out from under a
    drawer that is about to be opened over it, where the hand could no longer reach it."""

    def __init__(self, obj: str, spot: np.ndarray, surface_z: float):
        super().__init__(obj, None, None, release_height=0.01, clearance=0.04, settle=4)
        self.spot, self.surface_z = spot, surface_z

    def goal_point(self, sim) -> tuple[np.ndarray, float]:
        return self.spot, self.surface_z


def set_aside(task, obj: str, opener: SlideOpenExpert) -> SetAsideExpert | None:
    """The step that clears ``obj`` out of the way of ``opener``'s drawer, or None when the hand, coming down on
    the object, stays clear of the open drawer anyway (or no spot is free, or the episode is too short for it).
    The object goes to the nearest spot (in any direction, at most MAX_SET_ASIDE away) where the hand's narrow
    side clears the drawer and the object clears its neighbours (2 cm around it)."""
    if task.max_episode_steps < SET_ASIDE_HORIZON:
        return None
    pull, across, box, drawer_bottom = opener.swept()
    pts = collision_corners(task.sim, f"{obj}_main")
    if pts[:, 2].max() > drawer_bottom:
        return None  # as tall as the drawer: it is beside it, not under it

    def blocked(offset: np.ndarray, margin: float) -> bool:
        u, v = (pts + offset) @ pull, (pts + offset) @ across
        return bool(u.max() + margin > box[0, 0] and u.min() - margin < box[0, 1]
                    and v.max() + margin > box[1, 0] and v.min() - margin < box[1, 1])

    if not blocked(np.zeros(3), HAND_HALF_WIDTH):
        return None
    lo, hi = pts.min(0), pts.max(0)
    # where it goes: clear of everything up to the hand's height above it; on the way (carried 4 cm up):
    # clear of whatever stands taller than that
    at_spot = ObstacleBoxes(task.sim, {obj}, lo[2] + 0.005, hi[2] + 0.15)
    on_way = ObstacleBoxes(task.sim, {obj}, lo[2] + 0.045, hi[2] + 0.15)
    centre, half = (lo + hi) / 2, float(np.max(hi[:2] - lo[:2])) / 2
    around = [np.array([np.cos(a), np.sin(a)]) for a in np.linspace(0, 2 * np.pi, 12, endpoint=False)]
    edge = [half * r for r in around]  # the object's outline, roughly
    disc = [np.zeros(2)] + [half / 2 * r for r in around] + edge
    directions = [np.array([np.cos(a), np.sin(a), 0.0]) for a in np.deg2rad(np.arange(0, 360, 15))]
    for dist in np.arange(0.02, MAX_SET_ASIDE + 1e-9, 0.01):
        for direction in directions:
            offset = direction * dist
            if blocked(offset, HAND_HALF_WIDTH + 0.01):
                continue
            moved = centre + offset
            if min(at_spot.distance(moved[:2] + p) for p in disc) < 0.02:
                continue
            path = [centre[:2] + offset[:2] * t + p for t in np.linspace(0, 1, 6) for p in edge]
            if min(on_way.distance(p) for p in path) < 0.01:
                continue
            return SetAsideExpert(obj, moved[:2], float(lo[2]))
    return None  # crowded all round: the pick goes on as before, reaching in past the drawer


def push_back(task, pick: PickPlaceExpert) -> JointPushExpert | None:
    """The step that pushes the open drawer ``pick`` puts its object into (its goal region's) in by as much as the
    hand, coming down on the object across its narrow side, needs to clear the drawer (HAND_ROOM): libero_90
    KITCHEN_SCENE10's top drawer starts 14.8 cm out, 15 cm over the table, its handle 5-7 cm from the chocolate
    pudding's side. None when the hand clears it as it is, the drawer would be left too shallow for the object, or
    the object is gripped by its rim or handle (KITCHEN_SCENE5's bowl, pinched on the side away from the drawer:
    19/20 as it was, 11/20 after a push-back)."""
    obj, joint = joint_for(task, pick.target_site)
    art = Articulation(task, joint)
    if art.kind != SLIDE:
        return None
    # a push toward closed moves qpos the way LIBERO's close test holds (it holds near that limit)
    close_sign = 1.0 if obj.is_close(art.qpos + 10.0) else -1.0
    _, push = art.contact(close_sign)
    pull = -push
    drawer = art.corners()
    pts = collision_corners(task.sim, f"{pick.obj}_main")
    if pts[:, 2].max() > drawer[:, 2].min():
        return None  # as tall as the drawer's underside: beside it, not under it
    yaw, width = narrow_direction(pts)
    if width > MAX_GRASP_WIDTH or pick.by_handle:
        return None  # gripped at its rim or handle, on the side with most room: the hand keeps off the drawer itself
    centre = (pts[:, :2].min(0) + pts[:, :2].max(0)) / 2
    along, side = np.array([np.cos(yaw), np.sin(yaw)]), np.array([-np.sin(yaw), np.cos(yaw)])
    hand = np.array([centre + along * a + side * b for a in (-HAND_HALF_SPAN, HAND_HALF_SPAN)
                     for b in (-HAND_HALF_WIDTH, HAND_HALF_WIDTH)])
    across = np.array([-pull[1], pull[0]])
    u, v = drawer[:, :2] @ pull[:2], drawer[:, :2] @ across
    hand_u, hand_v = hand @ pull[:2], hand @ across
    if hand_v.max() < v.min() or hand_v.min() > v.max():
        return None  # the hand comes down beside the drawer
    overlap = float(u.max() + HAND_ROOM - hand_u.min())
    if overlap <= 0:
        return None
    rate = float(abs(art.axis()[:2] @ pull[:2]))  # metres along the pull per unit of qpos
    target = art.qpos + close_sign * overlap / rate
    # how far out the drawer is left: no less than the object's narrow side with room for the walls and the carry
    closed = float(task.sim.model._model.jnt_range[art.joint][1 if close_sign > 0 else 0])
    if abs(closed - target) * rate < width + DRAWER_ROOM:
        return None
    return JointPushExpert(art, close_sign, lambda q: (q - target) * close_sign >= -0.003, stop_at=target)
