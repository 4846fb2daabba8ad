"""A layer of a piece of furniture (a shelf's, a microwave's) as the LIBERO experts that put things into it see it:
its floor, its ceiling and its open side (``shelf_layer``), and what of an object still sticks out of that side, as
a part for a pushing expert to push in (``StickingOut``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ript.experts.libero.geometry import (
    ObstacleBoxes,
    body_id,
    collision_corners,
    geom_box_corners,
    in_subtree,
    is_collision_geom,
    site_id,
)
from ript.experts.libero.joints import SLIDE

SLIDE_LIFT = 0.012  # the held object's bottom this far above the layer's floor while it slides in
BOARD_THICKNESS = 0.03  # a target's geom thinner than this over or under the region is a board, not a wall
# what sticks out of a layer is pushed in by a hand pointing this far down from level: the fingertips reach in
# under the boards
PUSH_LEAN = np.deg2rad(30)


@dataclass
class Layer:
    """A goal region's layer of its furniture: between ``floor`` (None: the table) and ``ceiling``, open towards
    ``open_dir`` (horizontal, unit); the region reaches ``half_depth`` and the boards over it ``front`` from the
    region's centre that way."""

    floor: float | None
    ceiling: float
    open_dir: np.ndarray
    half_depth: float
    front: float
    half_width: float  # the region's half extent across the open side


def shelf_layer(sim, target: str, site: str, obj: str) -> Layer | None:
    """The layer of ``target`` a goal region lies in, where ``target`` has a board over the region; None where
    nothing of it does. ``obj`` (the object to put there) is no wall: it may stand in front of the open side."""
    model, data = sim.model._model, sim.data._data
    root = body_id(model, f"{target}_main")
    i = site_id(model, site)
    centre, axes = data.site_xpos[i].copy(), data.site_xmat[i].reshape(3, 3)
    floor, ceiling, boards = None, None, []
    for g in range(model.ngeom):
        if not is_collision_geom(model, g) or not in_subtree(model, g, root):
            continue
        corners = geom_box_corners(model, data, g)
        lo, hi = corners.min(0), corners.max(0)
        if hi[2] - lo[2] > BOARD_THICKNESS or not np.all((lo[:2] <= centre[:2]) & (centre[:2] <= hi[:2])):
            continue
        if lo[2] >= centre[2]:
            ceiling = lo[2] if ceiling is None else min(ceiling, lo[2])
            boards.append(corners[:, :2])
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
    half_width = float(np.abs(np.array([-best[1], best[0]])) @ half[:2])
    front = max(float(np.max((b - centre[:2]) @ best)) for b in boards)  # where the boards over it end
    return Layer(floor, float(ceiling), best, half_depth, front, half_width)


class StickingOut:
    """What of ``obj`` sticks out of a layer's open side, as a part for ``LeaningPushExpert`` or
    ``JointPushExpert`` to push in (straight, as a drawer's slide): its contact is the object's outermost face, and
    its ``qpos`` how far inside the boards' front that face is."""

    kind = SLIDE

    def __init__(self, sim, obj: str, layer: Layer, front_point: np.ndarray):
        self.sim, self.obj = sim, obj
        self.inward = -layer.open_dir
        self.front_plane = float(front_point @ self.inward)  # the boards' front, along the push

    def corners(self) -> np.ndarray:
        return collision_corners(self.sim, f"{self.obj}_main")

    def contact(self, sign: float) -> tuple[np.ndarray, np.ndarray]:
        pts = self.corners()
        along = pts[:, :2] @ self.inward
        face = pts[along < along.min() + 0.01]
        return face.mean(0), np.array([*self.inward, 0.0])

    @property
    def qpos(self) -> float:
        return float((self.corners()[:, :2] @ self.inward).min()) - self.front_plane
