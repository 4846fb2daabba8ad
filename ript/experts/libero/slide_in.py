"""Putting a pan, a moka pot or a mug into a layer of its furniture (a shelf's, a microwave's) through the open
side, held by its handle.

LIBERO's two-layer shelf leaves 6.9 cm under its middle board and 13.5 cm between its boards, its microwave 14.4 cm
inside: a hand coming down from above cannot get in, but an object held at its handle goes in body first, the hand
on the handle outside. The expert picks the object by its handle, lifts it just clear of the layer's floor, carries
it out in front of the open side, slides it in — as deep as the hand, kept out in front, allows — and lets go;
where the handle still sticks out (a mug's is short), a hand leaning into the push shoves it in past the front, so
that a door can close."""

from __future__ import annotations

import numpy as np

from ript.experts.base import Phase
from ript.experts.libero.geometry import CLOSE, POS_SCALE, body_id, collision_corners, handle_grasp, site_id
from ript.experts.libero.layers import PUSH_LEAN, SLIDE_LIFT, Layer, StickingOut, shelf_layer
from ript.experts.libero.leaning import LeaningPushExpert
from ript.experts.libero.pick_place import PickPlaceExpert
from ript.experts.libero.turned_slide_in import turned_slide_in

HAND_REACH = 0.04  # the wrist's half width above the fingers: the hand stays this far out from a layer's open side
ON_FLOOR = 0.015  # the object's centre is let go at least this far inside the boards' front (over the floor)
ENTRY_MARGIN = 0.03  # it starts sliding in from this far out from the region's open side
SLID_BY_HANDLE = ("moka_pot", "frypan", "mug")  # a mug, carried by its rim elsewhere, goes into a layer by its handle
PUSHED_PAST = 0.01  # what stuck out of the open side is pushed this far in past the boards' front
HANDLE_TURN = np.deg2rad(60)  # the handle must point within this of the open side (the hand stays outside)


class SlideInExpert(PickPlaceExpert):
    """Pick ``obj`` by its handle and slide it into ``site``, a layer of ``target`` (a shelf, a microwave), from its
    open side: its centre to the region's centre, or nearer the open side where the hand on the handle would
    otherwise meet the boards over the layer (``depth``: the centre's distance from the region's centre, towards
    the open side).

    Phases: those of ``PickPlaceExpert`` to the lift, then lift, carry, enter, lower, release."""

    def __init__(self, obj: str, target: str, site: str, layer: Layer, depth: float = 0.0):
        super().__init__(obj, target, site)
        self.by_handle = True
        self.layer, self.depth = layer, depth

    HOLDING = (Phase.LIFT, Phase.CARRY, Phase.ENTER, Phase.LOWER)

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
        if self.phase == Phase.LIFT:
            goal = np.array([eef[0], eef[1], carry_z])
            if eef[2] > carry_z - 0.01:
                self.phase = Phase.CARRY
        elif self.phase == Phase.CARRY:
            goal = np.array([*(entry + grip), carry_z if np.linalg.norm(entry - com) > 0.03 else slide_z])
            if np.linalg.norm(entry - com) < 0.015 and abs(eef[2] - slide_z) < 0.01:
                self.phase = Phase.ENTER
        elif self.phase == Phase.ENTER:
            goal = np.array([*(tgt_xy + grip), slide_z])
            if np.linalg.norm(tgt_xy - com) < 0.015:
                self.phase = Phase.LOWER
        elif self.phase == Phase.LOWER:
            goal = np.array([*(tgt_xy + grip), floor + self.hang + 0.004])
            if eef[2] < goal[2] + 0.006:
                self.phase, self.timer = Phase.RELEASE, 0
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
