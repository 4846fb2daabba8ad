"""Placing a pot or pan held by its handle into a layer of a shelf, through the layer's open side.

LIBERO's two-layer shelf leaves 6.9 cm under its middle board and 13.5 cm between its boards: a hand coming down
from above cannot get between them, but a frying pan held at the end of its handle goes in flat, body first, with
the handle and the hand on it left outside. The expert picks the object as every placement does, lifts it just
clear of the layer's floor, carries it to a point out in front of the open side, slides it in and lets go.
"""

from __future__ import annotations

import numpy as np

from ript.data.libero_experts import (CLOSE, POS_SCALE, ObstacleBoxes, PickPlaceExpert, _body_id, _geom_box_corners,
                                      _is_collision_geom, _site_id, collision_corners, handle_grasp)

SLIDE_LIFT = 0.012  # the held object's bottom this far above the layer's floor while it slides in
ENTRY_MARGIN = 0.03  # it starts sliding in from this far out from the region's open side
BOARD_THICKNESS = 0.03  # a target's geom thinner than this over or under the region is a board, not a wall
HANDLE_TURN = np.deg2rad(60)  # the handle must point within this of the open side (the hand stays outside)


def shelf_layer(sim, target: str, site: str, obj: str) -> tuple[float | None, float, np.ndarray, float] | None:
    """(floor height or None for the table, ceiling height, open direction, the region's half depth along it)
    of a goal region that ``target`` has a board over; None where nothing of it lies over the region. ``obj``
    (the object to put there) is no wall: it may stand in front of the open side."""
    model, data = sim.model._model, sim.data._data
    root = _body_id(model, f"{target}_main")
    i = _site_id(model, site)
    centre, axes = data.site_xpos[i].copy(), data.site_xmat[i].reshape(3, 3)
    floor, ceiling = None, None
    for g in range(model.ngeom):
        b = int(model.geom_bodyid[g])
        while b not in (0, root):
            b = int(model.body_parentid[b])
        if b != root or not _is_collision_geom(model, g):
            continue
        corners = _geom_box_corners(model, data, g)
        lo, hi = corners.min(0), corners.max(0)
        if hi[2] - lo[2] > BOARD_THICKNESS or not np.all((lo[:2] <= centre[:2]) & (centre[:2] <= hi[:2])):
            continue
        if lo[2] >= centre[2]:
            ceiling = lo[2] if ceiling is None else min(ceiling, lo[2])
        elif hi[2] <= centre[2]:
            floor = hi[2] if floor is None else max(floor, hi[2])
    if ceiling is None:
        return None
    # the open side: of the region's four horizontal directions, the one a point leaving its centre between
    # floor and ceiling travels farthest along before meeting anything
    bottom = floor if floor is not None else centre[2] - 0.1
    walls = ObstacleBoxes(sim, {obj}, bottom + 0.01, ceiling - 0.005)
    half = np.abs(axes) @ model.site_size[i]  # the region's half extents along the world's axes
    best, best_run = None, -1.0
    for axis in axes.T:  # a region site's frame may be turned: its horizontal axes
        if abs(axis[2]) > 0.5:
            continue
        for sign in (1.0, -1.0):
            d = sign * axis[:2] / np.linalg.norm(axis[:2])
            run = next((t for t in np.arange(0.0, 0.4, 0.01) if walls.distance(centre[:2] + d * t, 3) < 0.003), 0.4)
            if run > best_run:
                best, best_run = d, run
    half_depth = float(np.abs(best) @ half[:2])
    return floor, float(ceiling), best, half_depth


class SlideInExpert(PickPlaceExpert):
    """Pick ``obj`` by its handle and slide it into ``site``, a layer of ``target`` (a shelf), from its open side."""

    def __init__(self, obj: str, target: str, site: str, layer: tuple[float | None, float, np.ndarray, float]):
        super().__init__(obj, target, site)
        self.floor, self.ceiling, self.open_dir, self.half_depth = layer

    def get_action(self, task) -> np.ndarray:
        if self.phase in ("align", "descend", "grasp"):
            return super().get_action(task)
        sim, raw = task.sim, task.privileged()
        eef = raw["robot0_eef_pos"]
        obj_pts = collision_corners(sim, f"{self.obj}_main")
        com = sim.data._data.xipos[_body_id(sim.model._model, f"{self.obj}_main")][:2]
        if self.phase in ("lift", "carry", "enter", "lower") and eef[2] - obj_pts[:, 2].min() > self.hang + 0.04:
            self.phase = "align"  # slipped out of the fingers: grasp again
            return super().get_action(task)
        floor = self.floor if self.floor is not None else self.rest_z
        slide_z = floor + SLIDE_LIFT + self.hang
        lead = float(np.max((obj_pts[:, :2] - com) @ -self.open_dir))  # how far the object reaches in first
        tgt_xy = self._target_xy(sim)
        entry = tgt_xy + self.open_dir * (self.half_depth + lead + ENTRY_MARGIN)
        grip = eef[:2] - com  # the hand's offset from the object's centre
        carry_z = max(slide_z, self.rest_z + self.hang + 0.03)
        if self.phase == "lift":
            goal = np.array([eef[0], eef[1], carry_z])
            if eef[2] > carry_z - 0.01:
                self.phase = "carry"
        elif self.phase == "carry":
            goal = np.array([*(entry + grip), carry_z if np.linalg.norm(entry - com) > 0.03 else slide_z])
            if np.linalg.norm(entry - com) < 0.015 and abs(eef[2] - slide_z) < 0.01:
                self.phase = "enter"
        elif self.phase == "enter":
            goal = np.array([*(tgt_xy + grip), slide_z])
            if np.linalg.norm(tgt_xy - com) < 0.015:
                self.phase = "lower"
        elif self.phase == "lower":
            goal = np.array([*(tgt_xy + grip), floor + self.hang + 0.004])
            if eef[2] < goal[2] + 0.006:
                self.phase, self.timer = "release", 0
        else:
            return super().get_action(task)  # release, then back off upwards
        action = np.zeros(7)
        action[:3] = np.clip((goal - eef) / POS_SCALE * 1.5, -1.0, 1.0)
        action[6] = CLOSE
        return action

    def _target_xy(self, sim) -> np.ndarray:
        return sim.data._data.site_xpos[_site_id(sim.model._model, self.target_site)][:2] + self.offset


def handle_points_out(sim, obj: str, open_dir: np.ndarray) -> bool:
    """Whether ``obj``'s handle points within HANDLE_TURN of ``open_dir`` (the hand on it stays outside)."""
    grip_xy, _, _ = handle_grasp(sim, f"{obj}_main")
    out = grip_xy - sim.data._data.xipos[_body_id(sim.model._model, f"{obj}_main")][:2]
    return float(out @ open_dir) > np.cos(HANDLE_TURN) * float(np.linalg.norm(out))
