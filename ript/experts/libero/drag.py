"""Dragging a flat, wide object (a plate) along the table to a region of it (a LIBERO expert).

libero_goal's "push the plate to the front of the stove": the plate (1.8 cm tall, 14 cm across) is too wide to
grasp across and too light and shallow to lift by a rim pinch (it slips out every time: 1/5), and its far side
cannot be reached: the cabinet stands 2-4 cm behind it, and the arm's forearm meets the cabinet's top before the
fingers reach the table there. So the rim is pinched where the hand has room and the plate is
dragged along the table at the height it was gripped, around what stands near its path: straight, or through one
corner, whichever path keeps the plate (and the outer finger) farthest from the other objects, to the point of the
region that leaves it most room.
"""

from __future__ import annotations

import numpy as np

from ript.experts.base import Phase
from ript.experts.libero.geometry import (
    MAX_GRASP_WIDTH,
    ObstacleBoxes,
    collision_corners,
    narrow_direction,
    site_id,
    site_position,
)
from ript.experts.libero.pick_place import PickPlaceExpert

FLAT = 0.03  # an object at most this tall and wider than the hand opens is dragged, not carried
ROOM = 0.02  # clearance from other objects that a path need not exceed; beyond it the shorter path wins
REACHED = 0.03  # a corner of the path counts as reached with the object's centre this close
STEP = 0.01  # spacing of the clearance samples along a path and of the goal points in the region
OUTER_FINGER = 0.02  # how far the rim-pinching outer finger reaches past the object's outline


def drags(sim, obj: str) -> bool:
    """Whether ``obj`` is flat and too wide to grasp across: a plate."""
    pts = collision_corners(sim, f"{obj}_main")
    _, width = narrow_direction(pts)
    return float(np.ptp(pts[:, 2])) <= FLAT and width > MAX_GRASP_WIDTH


def region_points(sim, site: str, margin: float) -> list[np.ndarray]:
    """Points of a box region (LIBERO's On tests the object's centre inside it) ``margin`` in from its edges."""
    model, data = sim.model._model, sim.data._data
    i = site_id(model, site)
    rot = data.site_xmat[i].reshape(3, 3)[:2, :2]
    half = np.maximum(model.site_size[i][:2] - margin, 0.0)
    centre = site_position(sim, site)[:2]
    grid = [np.arange(-h, h + 1e-9, STEP) if h > 0 else np.zeros(1) for h in half]
    return [centre + rot @ np.array([u, v]) for u in grid[0] for v in grid[1]]


def plan_drag(sim, obj: str, site: str, rim: np.ndarray | None) -> list[np.ndarray]:
    """The object's centre's path to the region: its corners and last the goal point."""
    pts = collision_corners(sim, f"{obj}_main")
    lo, hi = pts.min(0), pts.max(0)
    start = (lo[:2] + hi[:2]) / 2
    radius = float(np.max(np.linalg.norm(pts[:, :2] - start, axis=1)))
    others = ObstacleBoxes(sim, {obj}, lo[2] + 0.005, hi[2] + 0.02)

    def clearance(xy: np.ndarray) -> float:
        room = others.distance(xy) - radius
        if rim is not None:  # the outer finger, outside the rim where it was pinched
            room = min(room, others.distance(xy + rim * (radius + OUTER_FINGER)))
        return room

    def score(path: list[np.ndarray]) -> float:
        legs = list(zip([start, *path[:-1]], path))
        length = sum(float(np.linalg.norm(b - a)) for a, b in legs)
        samples = [a + (b - a) * t for a, b in legs
                   for t in np.linspace(0.0, 1.0, max(2, int(np.linalg.norm(b - a) / STEP) + 1))]
        return min(min(clearance(p) for p in samples[1:]), ROOM) - 0.01 * length

    goals = region_points(sim, site, margin=0.01)
    goal = max(goals, key=lambda g: (min(clearance(g), ROOM), -float(np.linalg.norm(g - start))))
    paths = [[goal], [np.array([start[0], goal[1]]), goal], [np.array([goal[0], start[1]]), goal]]
    return max(paths, key=score)


class DragExpert(PickPlaceExpert):
    """Pinch the rim, then drag the object at the grip's height through ``plan_drag``'s corners and let go."""

    def __init__(self, obj: str, site: str):
        super().__init__(obj, None, site, release_height=0.0, clearance=0.0)
        self.route: list[np.ndarray] | None = None

    def goal_point(self, sim) -> tuple[np.ndarray, float]:
        goal, top = super().goal_point(sim)
        if self.phase not in (Phase.CARRY, Phase.LOWER):
            return goal, top
        if self.route is None:
            self.route = plan_drag(sim, self.obj, self.target_site, self.rim)
        pts = collision_corners(sim, f"{self.obj}_main")
        xy = (pts[:, :2].min(0) + pts[:, :2].max(0)) / 2
        while len(self.route) > 1 and np.linalg.norm(self.route[0] - xy) < REACHED:
            self.route.pop(0)
        # the carry puts the object's centre at the returned point plus the region shift (none on the table)
        return self.route[0] - self.shift, top
