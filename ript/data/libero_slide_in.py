"""Putting a pan, a moka pot or a mug into a layer of its furniture (a shelf's, a microwave's) through the open
side, held by its handle.

LIBERO's two-layer shelf leaves 6.9 cm under its middle board and 13.5 cm between its boards, its microwave 14.4 cm
inside: a hand coming down from above cannot get in, but an object held at its handle goes in body first, the hand
on the handle outside. The expert picks the object by its handle, lifts it just clear of the layer's floor, carries
it out in front of the open side, slides it in — as deep as the hand, kept out in front, allows — and lets go;
where the handle still sticks out (a mug's is short), a hand leaning into the push shoves it in past the front, so
that a door can close."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ript.data.libero_joints import SLIDE
from ript.data.libero_experts import PickPlaceExpert
from ript.data.libero_geometry import (CLOSE, POS_SCALE, body_id, collision_corners, geom_box_corners, handle_grasp,
                                        in_subtree, is_collision_geom, ObstacleBoxes, site_id)

HAND_REACH = 0.04  # the wrist's half width above the fingers: the hand stays this far out from a layer's open side
ON_FLOOR = 0.015  # the object's centre is let go at least this far inside the boards' front (over the floor)
SLIDE_LIFT = 0.012  # the held object's bottom this far above the layer's floor while it slides in
ENTRY_MARGIN = 0.03  # it starts sliding in from this far out from the region's open side
BOARD_THICKNESS = 0.03  # a target's geom thinner than this over or under the region is a board, not a wall
SLID_BY_HANDLE = ("moka_pot", "frypan", "mug")  # a mug, carried by its rim elsewhere, goes into a layer by its handle
PUSHED_PAST = 0.01  # what stuck out of the open side is pushed this far in past the boards' front
PUSH_LEAN = np.deg2rad(30)  # ... by a hand pointing this far down from level: the fingertips reach in under the boards
HANDLE_TURN = np.deg2rad(60)  # the handle must point within this of the open side (the hand stays outside)


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


class SlideInExpert(PickPlaceExpert):
    """Pick ``obj`` by its handle and slide it into ``site``, a layer of ``target`` (a shelf, a microwave), from its
    open side: its centre to the region's centre, or nearer the open side where the hand on the handle would
    otherwise meet the boards over the layer (``depth``: the centre's distance from the region's centre, towards
    the open side)."""

    def __init__(self, obj: str, target: str, site: str, layer: Layer, depth: float = 0.0):
        super().__init__(obj, target, site)
        self.by_handle = True
        self.layer, self.depth = layer, depth

    HOLDING = ("lift", "carry", "enter", "lower")

    def get_action(self, task) -> np.ndarray:
        sim, raw = task.sim, task.privileged()
        eef = raw["robot0_eef_pos"]
        obj_pts = collision_corners(sim, f"{self.obj}_main")
        if self.phase not in self.HOLDING or self.slipped(eef, float(obj_pts[:, 2].min()),
                                                          handle_grasp(sim, f"{self.obj}_main")[1]):
            return super().get_action(task)  # picking it up (again, if it slipped), or letting go
        com = sim.data._data.xipos[body_id(sim.model._model, f"{self.obj}_main")][:2]
        open_dir = self.layer.open_dir
        floor = self.layer.floor if self.layer.floor is not None else self.rest_z
        # the grip over the object's lowest point as it hangs now, as far as its top stays under the ceiling: held by
        # its handle, a pan tilts 10 degrees in the fingers and its far rim hangs 3-4 cm lower than when it was
        # grasped (it met the board's front: 2 in 20); a mug in a microwave has no room to rise. (Lowered as before:
        # let go higher, a mug landed where the push after it could not take it in.)
        under_ceiling = self.layer.ceiling - 0.005 - float(obj_pts[:, 2].max() - eef[2])
        hang = max(self.hang, min(float(eef[2] - obj_pts[:, 2].min()), under_ceiling - floor - SLIDE_LIFT))
        slide_z = floor + SLIDE_LIFT + hang
        lead = float(np.max((obj_pts[:, :2] - com) @ -open_dir))  # how far the object reaches in first
        tgt_xy = self._target_xy(sim)
        entry = tgt_xy + open_dir * (self.layer.half_depth + lead + ENTRY_MARGIN)
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
        action = np.zeros(7)
        action[:3] = np.clip((goal - eef) / POS_SCALE * 1.5, -1.0, 1.0)
        action[6] = CLOSE
        return action

    def _target_xy(self, sim) -> np.ndarray:
        centre = sim.data._data.site_xpos[site_id(sim.model._model, self.target_site)][:2]
        return centre + self.offset + self.layer.open_dir * self.depth


def slide_depth(sim, obj: str, layer: Layer) -> float | None:
    """How far from the region's centre, towards the open side, ``obj``'s centre goes when slid in by its handle
    with the hand kept HAND_REACH out from the boards' front: 0 where the handle is long enough (a pan); None
    where its handle does not point out of the open side (within HANDLE_TURN) or the centre would not get
    ON_FLOOR inside the boards' front (a push takes it on from there)."""
    grip_xy, _, _ = handle_grasp(sim, f"{obj}_main")
    out = grip_xy - sim.data._data.xipos[body_id(sim.model._model, f"{obj}_main")][:2]
    if float(out @ layer.open_dir) <= np.cos(HANDLE_TURN) * float(np.linalg.norm(out)):
        return None
    depth = max(0.0, layer.front + HAND_REACH - float(out @ layer.open_dir))
    return depth if depth <= layer.front - ON_FLOOR else None


def slide_in_steps(task, obj: str, target: str, site: str) -> list | None:
    """The steps that put ``obj`` into ``site`` through its layer's open side: slid in by its handle, then, where
    the hand could not take it deep enough, what still sticks out pushed in with a leaning hand (so that a door
    can close); None where ``site`` is no such layer or the object cannot go in this way."""
    from ript.data.libero_tilted_push import LeaningPushExpert
    from ript.data.libero_turned_slide_in import turned_slide_in

    if not any(kind in obj for kind in SLID_BY_HANDLE):
        return turned_slide_in(task, obj, target, site)
    layer = shelf_layer(task.sim, target, site, obj)
    depth = None if layer is None else slide_depth(task.sim, obj, layer)
    if depth is None:
        return None
    steps = [SlideInExpert(obj, target, site, layer, depth)]
    if depth > 0:
        centre = task.sim.data._data.site_xpos[site_id(task.sim.model._model, site)][:2]
        part = StickingOut(task.sim, obj, layer, centre + layer.open_dir * layer.front)
        steps.append(LeaningPushExpert(task, part, 1.0, lambda inside: inside > PUSHED_PAST, PUSH_LEAN))
    return steps


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
