"""Putting a standing box that is too tall for a shelf's layer into it on its long edge (a LIBERO expert).

libero_90 STUDY_SCENE4's black book stands 13.4 cm under a 13.5 cm board, a yellow one 12.2 cm: held from above,
neither goes in (0/20). Held by its top edge and turned in the hand until the fingers point into the layer, a book
lies along them with its 11 cm width upright, and slides in through the open side at the floor's height. The
forearm then trails behind the hand at that height: the way in (its direction and where across the open side) is
the one that keeps it farthest from the other books standing in front of the shelf. Under the shelf's middle board
(6.9 cm) only lying flat fits, and no grasp holds a flat book with the hand above the table: the book is tipped over
towards the shelf and pushed in along the table by a hand leaning into the push.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ript.experts.base import Phase
from ript.experts.libero.geometry import (
    CLOSE,
    OPEN,
    POS_SCALE,
    ObstacleBoxes,
    collision_corners,
    hand_turn,
    narrow_direction,
    rotation_matrix,
    rotation_vector,
    site_id,
)
from ript.experts.libero.joints import SLIDE
from ript.experts.libero.layers import PUSH_LEAN, SLIDE_LIFT, Layer, StickingOut, shelf_layer
from ript.experts.libero.leaning import LeaningPushExpert
from ript.experts.libero.pick_place import PickPlaceExpert
from ript.experts.libero.push import JointPushExpert

STANDING_HAND = 0.05  # what a hand over a standing box needs above its top (the fingers reach 3 cm over it)
TURN_ROOM = 0.04  # the box, turned in the hand, sweeps round this far out from the layer's open side
FINGERS_IN = 0.03  # the fingers of a hand pointing into a layer go at most this far in past its boards' front
SIDE_MARGIN = 0.01  # the box's outline, set down, keeps this far inside the region
# the forearm behind a level hand: how far back from the grip it is looked for, from how far under the grip to how
# far over it, and the clearance a way in need not exceed (its wrist link is 6 cm in radius: 0/8 with 5)
FOREARM_LENGTH, FOREARM_BELOW, FOREARM_ABOVE, FOREARM_CLEARANCE = 0.3, 0.03, 0.12, 0.07
WAY_IN_ANGLES = (0, 20, -20, 40, -40)  # degrees off straight into the layer a box may go in
RELEASE_WAIT = 8  # steps the fingers take to open before the hand backs out
LYING = 0.02  # a tipped box counts as lying once its height is within this of its thickness


@dataclass
class WayIn:
    """A straight way into the layer: the grip's position once the box is in (``inside``), where the box is turned
    (``outside``), and the horizontal direction the fingers point (``pointing``)."""

    inside: np.ndarray
    outside: np.ndarray
    pointing: np.ndarray


class TurnedSlideInExpert(PickPlaceExpert):
    """Pick the box from above by its top edge, lift it clear and carry it to the start of the way in, turn the hand
    there until the fingers point along it, come down to the layer's floor, slide the box in, set it on its edge,
    open the fingers and back out the way the hand came.

    Phases: those of ``PickPlaceExpert`` to the lift, then lift, carry, turn, drop, enter, lower, release."""

    HOLDING = (Phase.LIFT, Phase.CARRY, Phase.TURN, Phase.DROP, Phase.ENTER, Phase.LOWER)

    def __init__(self, obj: str, target: str, site: str, layer: Layer):
        super().__init__(obj, target, site)
        self.layer = layer
        self.turned: np.ndarray | None = None  # the hand's rotation once it points into the layer
        self.reach = 0.0  # how far the box reaches past the grip site along the fingers, once turned
        self.behind = 0.0  # ... and back towards the hand (its top edge, between the fingers)
        self.upright = 0.0  # its half extent across the fingers and their closing direction: upright once turned
        self.thick = 0.0  # its half extent along the fingers' closing direction
        self.way: WayIn | None = None
        self.turn_z = 0.0  # the grip's height while the box swings round

    @property
    def finished(self) -> bool:
        return self.phase == Phase.RELEASE and self.timer > RELEASE_WAIT + self.settle

    def _measure(self, obj_pts: np.ndarray, eef: np.ndarray) -> None:
        """The box's extents about the grip, once it is grasped."""
        closing = np.array([np.cos(self.grasp_yaw), np.sin(self.grasp_yaw)])
        self.thick = float(np.ptp(obj_pts[:, :2] @ closing)) / 2
        self.upright = float(np.ptp(obj_pts[:, :2] @ np.array([-closing[1], closing[0]]))) / 2
        self.reach = float(eef[2] - obj_pts[:, 2].min())
        self.behind = float(obj_pts[:, 2].max() - eef[2])

    def _plan(self, sim, slide_z: float) -> None:
        """The way in that keeps the forearm farthest from what stands in front of the layer (up to
        FOREARM_CLEARANCE), straighter and nearer the region's middle on a tie; the box's middle at the region's
        centre, or nearer the open side where the fingers would go deeper than FINGERS_IN."""
        centre = sim.data._data.site_xpos[site_id(sim.model._model, self.target_site)][:2]
        open_dir = self.layer.open_dir
        across = np.array([-open_dir[1], open_dir[0]])
        half_across = self.layer.half_width - SIDE_MARGIN
        forearm = ObstacleBoxes(sim, {self.obj, self.target}, slide_z - FOREARM_BELOW, slide_z + FOREARM_ABOVE)
        middle = (self.reach - self.behind) / 2  # from the grip to the box's middle, along the fingers
        best, best_score = None, -np.inf
        for angle in np.deg2rad(WAY_IN_ANGLES):
            c, s = np.cos(angle), np.sin(angle)
            pointing = -(open_dir * c + across * s)
            outline = [pointing * a + np.array([-pointing[1], pointing[0]]) * b
                       for a in (-(self.reach + self.behind) / 2, (self.reach + self.behind) / 2)
                       for b in (-self.thick, self.thick)]
            depth = max(0.0, self.layer.front - FINGERS_IN - middle * c)
            for offset in np.arange(-half_across, half_across + 1e-9, 0.01):
                box = centre + open_dir * depth + across * offset
                if max(abs(float((box + p - centre) @ across)) for p in outline) > half_across:
                    continue
                inside = box - pointing * middle
                # back from there until the box's far end is TURN_ROOM out of the open side
                far_out = float((inside - centre) @ open_dir) - self.reach * c
                outside = inside - pointing * ((self.layer.front + TURN_ROOM - far_out) / c)
                run = float(np.linalg.norm(outside - inside)) + FOREARM_LENGTH
                clear = min(forearm.distance(inside - pointing * t, 3) for t in np.arange(0.06, run, 0.02))
                score = min(clear, FOREARM_CLEARANCE) - 0.01 * abs(offset) - 0.001 * abs(angle)
                if score > best_score:
                    best, best_score = WayIn(inside, outside, pointing), score
        self.way = best
        others = ObstacleBoxes(sim, {self.obj}, self.rest_z + 0.005, self.rest_z + 0.5)
        self.turn_z = max(slide_z, others.top_near(best.outside, self.reach + TURN_ROOM) + self.reach + TURN_ROOM)

    def get_action(self, task) -> np.ndarray:
        sim, raw = task.sim, task.privileged()
        eef = raw["robot0_eef_pos"]
        obj_pts = collision_corners(sim, f"{self.obj}_main")
        picking = self.phase not in (*self.HOLDING, Phase.RELEASE)
        if picking or (self.turned is None and self.slipped(eef, float(obj_pts[:, 2].min()))):
            action = super().get_action(task)  # picking it up (again, if it slipped before the turn)
            if picking and self.phase == Phase.LIFT:
                self._measure(obj_pts, eef)
            return action
        slide_z = self.layer.floor + SLIDE_LIFT + self.upright
        if self.way is None:
            self._plan(sim, slide_z)
        way, goal, gripper = self.way, eef.copy(), CLOSE
        rotation = rotation_matrix(raw["robot0_eef_quat"])
        if self.phase == Phase.LIFT:
            goal = np.array([eef[0], eef[1], self.turn_z])
            if eef[2] > self.turn_z - 0.01:
                self.phase = Phase.CARRY
        elif self.phase == Phase.CARRY:
            goal = np.array([*way.outside, self.turn_z])
            if np.linalg.norm(way.outside - eef[:2]) < 0.015:
                self.phase = Phase.TURN
                _, self.turned = hand_turn(task, np.array([*way.pointing, 0.0]),
                                           np.array([-way.pointing[1], way.pointing[0], 0.0]))
        elif self.phase == Phase.TURN:
            goal = np.array([*way.outside, self.turn_z])
            if np.linalg.norm(rotation_vector(self.turned @ rotation.T)) < 0.08:
                self.phase = Phase.DROP
        elif self.phase == Phase.DROP:
            goal = np.array([*way.outside, slide_z])
            if abs(eef[2] - slide_z) < 0.008:
                self.phase = Phase.ENTER
        elif self.phase == Phase.ENTER:
            goal = np.array([*way.inside, slide_z])
            if np.linalg.norm(way.inside - eef[:2]) < 0.01:
                self.phase = Phase.LOWER
        elif self.phase == Phase.LOWER:
            goal = np.array([*way.inside, self.layer.floor + self.upright + 0.004])
            if eef[2] < goal[2] + 0.005:
                self.phase, self.timer = Phase.RELEASE, 0
        else:  # release: let go, then back out along the fingers (not up: the board over them)
            gripper = OPEN
            goal = np.array([*(way.inside - way.pointing * (TURN_ROOM if self.timer > RELEASE_WAIT else 0.0)), eef[2]])
            self.timer += 1
        action = np.zeros(7)
        action[:3] = np.clip((goal - eef) / POS_SCALE * 1.5, -1.0, 1.0)
        if self.turned is not None:
            action[3:6] = np.clip(2.0 * rotation_vector(self.turned @ rotation.T), -1.0, 1.0)
        action[6] = gripper
        return action


class StandingBox:
    """A standing box as the part ``JointPushExpert`` pushes to tip it over: at its top (pushed like a drawer, 3 cm
    under its top), along its narrow side the way that faces ``towards``; its ``qpos`` is its height now."""

    kind = SLIDE

    def __init__(self, sim, obj: str, towards: np.ndarray):
        self.sim, self.obj = sim, obj
        yaw, _ = narrow_direction(self.corners())
        push = np.array([np.cos(yaw), np.sin(yaw)])
        self.push = np.array([*(push if push @ towards >= 0 else -push), 0.0])

    def corners(self) -> np.ndarray:
        return collision_corners(self.sim, f"{self.obj}_main")

    def contact(self, sign: float) -> tuple[np.ndarray, np.ndarray]:
        pts = self.corners()
        along = pts @ self.push
        return pts[along < along.min() + 0.01].mean(0), self.push  # the face the fingertip meets

    @property
    def qpos(self) -> float:
        return float(np.ptp(self.corners()[:, 2]))


def tip_and_push_in(task, obj: str, target: str, site: str, layer: Layer) -> list:
    """Tip the box over towards the layer's open side, onto its face, then push it in along the table with the hand
    leaning into the push, the fingertips in under the board, until LIBERO's test of the goal region holds (it tests
    the box's origin, at its former bottom: the face nearest the hand, which must go 1 cm in past the boards'
    front; the hand pointing down stops there with its palm against the board)."""
    pts = collision_corners(task.sim, f"{obj}_main")
    _, thick = narrow_direction(pts)
    tip = JointPushExpert(StandingBox(task.sim, obj, -layer.open_dir), 1.0, lambda height: height < thick + LYING)
    centre = task.sim.data._data.site_xpos[site_id(task.sim.model._model, site)][:2]
    states = task.env.env.object_states_dict
    lying = StickingOut(task.sim, obj, layer, centre + layer.open_dir * layer.front)
    push_in = LeaningPushExpert(task, lying, 1.0, lambda _: bool(states[site].check_contain(states[obj])), PUSH_LEAN)
    return [tip, push_in]


def turned_slide_in(task, obj: str, target: str, site: str) -> list | None:
    """The steps that put a standing box too tall for a layer under a board (with a hand over it: STANDING_HAND)
    into it: slid in on its long edge where that fits (``TurnedSlideInExpert``); tipped over and pushed in along the
    table where the layer's floor is the table and only lying flat fits; None for a box that fits standing or a
    region that is no such layer."""
    layer = shelf_layer(task.sim, target, site, obj)
    if layer is None:
        return None
    pts = collision_corners(task.sim, f"{obj}_main")
    yaw, thick = narrow_direction(pts)
    width = float(np.ptp(pts[:, :2] @ np.array([-np.sin(yaw), np.cos(yaw)])))
    floor = layer.floor if layer.floor is not None else float(pts[:, 2].min())
    room = layer.ceiling - floor
    if float(np.ptp(pts[:, 2])) + STANDING_HAND <= room:
        return None
    if layer.floor is not None and width + SLIDE_LIFT + 0.005 <= room:
        return [TurnedSlideInExpert(obj, target, site, layer)]
    if layer.floor is None and thick + LYING <= room:
        return tip_and_push_in(task, obj, target, site, layer)
    return None
