"""Privileged-state scripted experts for LIBERO pick-and-place tasks.

The expert reads object and end-effector poses from the simulator (not the images) and drives the
default OSC_POSE controller with delta actions: turn the gripper so its fingers close across the
object's narrow side, hover, descend, grasp, lift, carry over the target, lower and release.
Object sizes come from their collision geometry, so one expert serves every object of a suite.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ript.experts.base import Phase
from ript.experts.libero.fit import goal_walls, roomiest_shift, slot_yaw, step_away_from_snag
from ript.experts.libero.geometry import (
    CLOSE,
    HAND_CLEARANCE,
    HAND_HALF_SPAN,
    HAND_HALF_WIDTH,
    MAX_GRASP_WIDTH,
    OPEN,
    POS_SCALE,
    ObstacleBoxes,
    body_id,
    collision_corners,
    handle_grasp,
    level_hand,
    narrow_direction,
    site_position,
    yaw_error,
)

RIM_INSET = 0.012  # grip point inside the outer edge for a wall/rim pinch
SLOT_ALIGN = 0.005  # how close over a slot a held object must be before it goes down into it
# ... and over an object it goes onto before it is let go: the carry's momentum took a bowl 2.7 cm past a plate's centre
# while it was lowered, and LIBERO's On holds within 3 cm (libero_90 KITCHEN_SCENE2); waited for at most
# PLACE_WAIT steps at the release height (something the object touches may keep it off) or without getting lower
PLACE_ALIGN, PLACE_WAIT = 0.008, 20
# a mug let go 3 cm over its plate's rim tipped 4.8 cm off the plate's centre as it fell (LIVING_ROOM_SCENE5)
RIM_RELEASE = 0.01
FAST_DESCENT = 0.08
SNAG_WAIT = 10  # steps stuck on the way into a drawer before a step away from what caught the object
HURRIED_CLEARANCE = 0.05  # ... and carried 5 cm over the drawer's walls, not 10 (the default clearance)
HANDLED = ("moka_pot", "frypan")  # too wide to grasp and closed (a lid) or flat: held by their handles
HANDLE_TURN = 60  # degrees off square a handle may be gripped to keep the hand clear of its neighbours


@dataclass
class Seen:
    """What one step of a pick and place reads off the scene before its plan moves on."""

    eef: np.ndarray  # the grip site
    obj_pts: np.ndarray  # the object's collision-box corners
    lo: np.ndarray  # ... their lowest
    hi: np.ndarray  # ... and highest coordinates
    place_xy: np.ndarray  # the point of the object put over the goal
    grasp_xy: np.ndarray  # where the object is gripped
    grasp_z: float
    tgt_xy: np.ndarray  # the goal point
    tgt_top: float  # the height of what the object goes onto there


class PickPlaceExpert:
    """Pick ``obj`` and release it above ``target`` (an object), or above ``target_site`` alone (a region of
    the table). ``get_action(task)`` reads the task's simulator.

    Phases: align, descend, grasp, lift, carry, lower, release (back to align if the object slips)."""

    def __init__(self, obj: str, target: str | None, target_site: str | None = None, release_height: float = 0.03,
                 clearance: float = 0.10, settle: int = 10, surface_body: str | None = None):
        self.obj, self.target, self.target_site = obj, target, target_site
        self.surface_body = surface_body  # what the object lands on, when not the whole target (a drawer)
        self.release_height, self.clearance = release_height, clearance
        self.phase, self.timer = Phase.ALIGN, 0
        self.rim: np.ndarray | None = None  # unit vector from the object's centre to its grasped rim, if any
        self.grasp_yaw = 0.0
        self.hang = 0.0  # grip site height above the held object's bottom
        self.handle_hang = 0.0  # ... and above the grip height on its handle, for a pot or pan held by its handle
        self.rest_z = 0.0  # height of the object's bottom where it was picked up
        self.settle = settle  # steps after the release before the next step of a sequence may start
        self.place_yaw: float | None = None  # finger direction while carrying, when the goal region is a slot
        self.slotted = False  # the goal region is a walled slot the object is turned into
        self.by_handle = any(kind in obj for kind in HANDLED)
        self.offset = np.zeros(2)  # from the region's centre, when several objects go to one region
        self.shift = np.zeros(2)  # from there, to where the held object has most room from a container's walls
        self.lowest = np.inf  # the hand's lowest height while lowering the object
        self.unsnagged = 0.0  # how far the goal has been moved away from what caught the object on its way down
        # down at full speed until FAST_DESCENT over the grasp: the three steps of a set-aside drawer task do not
        # fit libero_goal's 300 steps otherwise (everywhere, it lost more picks than it won)
        self.fast_descent = False

    HOLDING = (Phase.LIFT, Phase.CARRY, Phase.LOWER)  # the phases with the object in the hand

    @property
    def onto_object(self) -> bool:
        """Onto an object (LIBERO's On then tests the two origins, within 3 cm) or a set-aside's spot on the table,
        not into a goal region or a drawer."""
        return self.target_site is None and self.surface_body is None

    @property
    def finished(self) -> bool:
        return self.phase == Phase.RELEASE and self.timer > self.settle

    def slipped(self, eef: np.ndarray, obj_bottom: float, handle_z: float | None = None) -> bool:
        """Whether the held object has dropped out of the fingers: it hangs lower under the hand than when grasped,
        measured at the handle (``handle_z``, its grip height now) for a pot or pan held by it (a pan's weight tilts
        it 10 degrees in the fingers, and its far rim drops 4 cm while it is still held fast: KITCHEN_SCENE3's pan
        was let go and grasped again and again)."""
        if self.by_handle:
            return eef[2] - handle_z > self.handle_hang + 0.04
        return eef[2] - obj_bottom > self.hang + 0.04

    def _plan_grasp(self, sim, obj_pts: np.ndarray, obj_xy: np.ndarray) -> None:
        """Across the narrow side when it fits between the fingers; else pinch the wall (a bowl's rim),
        fingers closing radially, on the side where the outer finger has most room from other objects
        (ties go to the side facing the robot; the far side only when the near sides are walled in, as
        for a bowl in a drawer)."""
        self.grasp_yaw, width = narrow_direction(obj_pts)
        self.rim = None
        if self.by_handle:
            return
        if width <= MAX_GRASP_WIDTH:
            self.grasp_yaw = self._clear_hand_yaw(
                sim, self.grasp_yaw, obj_xy, float(obj_pts[:, 2].max()),
                lambda d: np.ptp(obj_pts[:, :2] @ d) <= MAX_GRASP_WIDTH)
            return
        lo, hi = obj_pts.min(0), obj_pts.max(0)
        # from just above the object's bottom: what it stands on (a drawer's floor) is no obstacle
        others = ObstacleBoxes(sim, {self.obj}, lo[2] + 0.01, hi[2] + 0.12)
        best = -np.inf
        for a in np.deg2rad(np.arange(0, 360, 30)):
            d = np.array([np.cos(a), np.sin(a)])
            half = float(np.max((obj_pts[:, :2] - obj_xy) @ d))
            outer = obj_xy + d * (half - RIM_INSET + 0.045)
            room = others.distance(outer)
            score = min(room, 0.06) + 0.001 * -d[0]  # the robot sits at -x
            if score > best:
                best, self.rim = score, d
        self.grasp_yaw = float(np.arctan2(self.rim[1], self.rim[0]))

    def _clear_hand_yaw(self, sim, base_yaw: float, centre: np.ndarray, top: float, fits,
                        max_turn: float = 30) -> float:
        """The finger direction for a grasp at ``centre`` across ``base_yaw``, turned by up to ``max_turn``
        degrees while ``fits`` (the object still between the fingers), that keeps the hand (wide along the
        fingers) farthest from neighbours taller than ``top``: a carton beside a flat box stops the hand above
        the box, a moka pot beside a pan's handle (base_yaw itself whenever its hand has HAND_CLEARANCE)."""
        others = ObstacleBoxes(sim, {self.obj}, top + 0.005, top + 0.15)
        best, best_score = base_yaw, -np.inf
        turns = [t for t in (0, 10, -10, 20, -20, 30, -30, 45, -45, 60, -60) if abs(t) <= max_turn]
        for turn in np.deg2rad(turns):
            yaw = base_yaw + turn
            d = np.array([np.cos(yaw), np.sin(yaw)])
            if not fits(d):
                continue
            clear = min(others.distance(centre + d * t) for t in np.linspace(-HAND_HALF_SPAN, HAND_HALF_SPAN, 9))
            if turn == 0 and clear >= HAND_CLEARANCE:
                return float(yaw)
            score = min(clear, HAND_CLEARANCE) - 0.001 * abs(turn)
            if score > best_score:
                best, best_score = float(yaw), score
        return best

    def goal_point(self, sim) -> tuple[np.ndarray, float]:
        """Where the object goes (the goal region's site, else the target's centre) and the height of the
        target's top around that point. A table region's site lies on the table's surface."""
        if self.target is None:
            site = site_position(sim, self.target_site)
            return site[:2] + self.offset, float(site[2])
        pts = collision_corners(sim, self.surface_body or f"{self.target}_main")
        xy = (pts[:, :2].min(0) + pts[:, :2].max(0)) / 2
        if self.onto_object:
            xy = sim.data._data.xpos[body_id(sim.model._model, f"{self.target}_main")][:2].copy()
        elif self.target_site is not None:
            xy = site_position(sim, self.target_site)[:2] + self.offset
        near = pts[np.linalg.norm(pts[:, :2] - xy, axis=1) < 0.08]
        return xy, float((near if len(near) else pts)[:, 2].max())

    def get_action(self, task) -> np.ndarray:
        sim, raw = task.sim, task.privileged()
        seen = self._read(sim, raw["robot0_eef_pos"])
        if self.phase in self.HOLDING and self.slipped(seen.eef, seen.lo[2], seen.grasp_z):
            self.phase = Phase.ALIGN  # the object slipped out of the fingers: open, line up and grasp again
        yaw_err = yaw_error(sim, self.grasp_yaw)
        if self.phase in (Phase.ALIGN, Phase.DESCEND, Phase.GRASP):
            goal, gripper = self._pick(sim, seen, yaw_err)
        elif self.phase == Phase.LOWER:
            goal, gripper = self._lower(sim, seen)
        else:
            goal, gripper = self._carry(sim, seen)
        return self._command(sim, raw, seen, goal, gripper, yaw_err)

    def _read(self, sim, eef: np.ndarray) -> Seen:
        """The object, where it is gripped, the point of it put over the goal and the goal, as they are now (in
        ``align``, the grasp is planned again from where the object stands)."""
        obj_pts = collision_corners(sim, f"{self.obj}_main")
        lo, hi = obj_pts.min(0), obj_pts.max(0)
        obj_xy = (lo[:2] + hi[:2]) / 2
        if self.phase == Phase.ALIGN:
            self._plan_grasp(sim, obj_pts, obj_xy)
        # the point of the object put over the target: onto an object, its body's origin (a mug's outline, handle
        # and all, is centred 3 cm off it: libero_90 LIVING_ROOM_SCENE5's mug missed its plate); into a region its
        # outline's centre, which the region's walls leave room for (by the origin, a book's 1.2 cm off it,
        # STUDY_SCENE3's right compartment fell 5/5 -> 1/5, and a bowl into a low drawer met the cabinet's front)
        place_xy = obj_xy
        if self.onto_object and not self.slotted:
            place_xy = sim.data._data.xpos[body_id(sim.model._model, f"{self.obj}_main")][:2].copy()
        if self.by_handle:
            # a handle shifts the footprint's centre off the pot or pan itself: place its centre of mass instead
            place_xy = sim.data._data.xipos[body_id(sim.model._model, f"{self.obj}_main")][:2].copy()
            grasp_xy, grasp_z, handle_yaw = handle_grasp(sim, f"{self.obj}_main")
            if self.phase == Phase.ALIGN:  # a handle is narrow: gripped 60 degrees off square it still fits (2 cm
                # wide, 4 cm across the fingers; KITCHEN_SCENE3's pan handle beside a moka pot leaves the hand
                # 3 mm at up to 30 degrees and 1.4-3 cm at 45-60: it stalled on the pot for 300 steps)
                self.grasp_yaw = self._clear_hand_yaw(sim, handle_yaw, grasp_xy, grasp_z + 0.015, lambda d: True,
                                                      max_turn=HANDLE_TURN)
        elif self.rim is not None:
            half = float(np.max(np.abs((obj_pts[:, :2] - obj_xy) @ self.rim)))
            grasp_xy = obj_xy + self.rim * (half - RIM_INSET)
            grasp_z = hi[2] - 0.015
        else:
            grasp_xy = obj_xy
            # flat things at their middle (clear of the table), tall ones 2.5 cm under the top: the palm
            # meets the top of a tall object about 3 cm below it
            grasp_z = max(lo[2] + 0.012, (lo[2] + hi[2]) / 2, hi[2] - 0.025)
        tgt_xy, tgt_top = self.goal_point(sim)
        return Seen(eef, obj_pts, lo, hi, place_xy, grasp_xy, grasp_z, tgt_xy, tgt_top)

    def _pick(self, sim, seen: Seen, yaw_err: float) -> tuple[np.ndarray, float]:
        """``align`` over the grasp point, ``descend`` to it, ``grasp``: the goal and the gripper's command."""
        eef, grasp_xy, grasp_z = seen.eef, seen.grasp_xy, seen.grasp_z
        if self.phase == Phase.ALIGN:
            goal = np.array([*grasp_xy, max(seen.hi[2] + 0.08, eef[2])])
            if np.linalg.norm(goal[:2] - eef[:2]) < 0.015 and abs(yaw_err) < 0.08:
                self.phase = Phase.DESCEND
            return goal, OPEN
        if self.phase == Phase.DESCEND:
            goal = np.array([*grasp_xy, grasp_z])
            xy_err = np.linalg.norm(goal[:2] - eef[:2])
            if xy_err > 0.02 and eef[2] < seen.hi[2] + 0.03:
                self.phase = Phase.ALIGN  # drifted or bumped the object: back up and line up again
            elif abs(eef[2] - grasp_z) < 0.01 and xy_err < 0.012:
                self.phase, self.timer = Phase.GRASP, 0
            return goal, OPEN
        self.timer += 1
        if self.timer >= 12:
            self.phase, self.hang, self.rest_z = Phase.LIFT, float(eef[2] - seen.lo[2]), float(seen.lo[2])
            self.handle_hang = float(eef[2] - grasp_z)
            self.place_yaw = slot_yaw(self, sim, seen.obj_pts)
            # turned into a walled slot (a compartment): kept upright and let go only once over it (not a pan
            # held by its handle: turned upright, it slips from the fingers)
            self.slotted = (self.place_yaw is not None and not self.by_handle
                            and goal_walls(self, sim, seen.tgt_top) is not None)
        return np.array([*grasp_xy, grasp_z]), CLOSE

    def _carry(self, sim, seen: Seen) -> tuple[np.ndarray, float]:
        """``lift`` the object, ``carry`` it over the goal; after ``release``, back off upwards."""
        eef, place_xy = seen.eef, seen.place_xy
        carry_z = max(seen.tgt_top, self.rest_z) + self.hang + self.clearance
        if self.phase == Phase.LIFT:
            if eef[2] > carry_z - 0.03:
                self.phase = Phase.CARRY
                outline = seen.obj_pts[:, :2] - place_xy
                if self.rim is not None:  # a rim pinch: the hand reaches out past the rim, as wide as it is thick
                    side = np.array([-self.rim[1], self.rim[0]]) * HAND_HALF_WIDTH
                    ends = [eef[:2] - place_xy + self.rim * r for r in (-HAND_HALF_SPAN, HAND_HALF_SPAN)]
                    outline = np.concatenate([outline, [e + k * side for e in ends for k in (-1, 1)]])
                if self.place_yaw is not None:  # as it will be once turned into the slot's direction
                    turn = yaw_error(sim, self.place_yaw)
                    outline = outline @ np.array([[np.cos(turn), np.sin(turn)], [-np.sin(turn), np.cos(turn)]])
                self.shift = roomiest_shift(self, sim, outline, seen.tgt_xy, seen.tgt_top)
            return np.array([eef[0], eef[1], carry_z]), CLOSE
        if self.phase == Phase.CARRY:
            # the grip sits off the held object's centre for a rim grasp: put the object, not the hand, over it
            goal = np.array([*(seen.tgt_xy + self.shift + eef[:2] - place_xy), carry_z])
            if np.linalg.norm(goal[:2] - eef[:2]) < 0.02:
                self.phase, self.timer, self.lowest = Phase.LOWER, 0, np.inf
            return goal, CLOSE
        goal = np.array([eef[0], eef[1], eef[2] + (0.05 if self.timer > 8 else 0.0)])
        self.timer += 1
        return goal, OPEN

    def _lower(self, sim, seen: Seen) -> tuple[np.ndarray, float]:
        """``lower`` the object onto or into the goal, and let go once it is over it and low enough."""
        eef = seen.eef
        # onto an object a rim-pinched object (a bowl, a mug), which pivots about the fingers as they open, is let
        # go lower (not into a drawer: lowered further and lined up, a bowl met the cabinet's front over a low
        # drawer and wedged there on its side)
        low = self.rim is not None and self.onto_object
        drop = min(self.release_height, RIM_RELEASE) if low else self.release_height
        goal = np.array([*(seen.tgt_xy + self.shift + eef[:2] - seen.place_xy), seen.tgt_top + self.hang + drop])
        # let go only once over the goal: into a slot (a compartment a few millimetres wider than the object)
        # within SLOT_ALIGN; onto an object within PLACE_ALIGN, or after PLACE_WAIT steps (below)
        xy_err = np.linalg.norm(goal[:2] - eef[:2])
        at_height = eef[2] < goal[2] + 0.01
        # steps at the release height, or without getting lower (the object stands on something on its way, as
        # a plate's rim): onto an object, let go after PLACE_WAIT of them however far off
        self.timer = self.timer + 1 if at_height or eef[2] > self.lowest - 0.002 else 0
        self.lowest = min(self.lowest, float(eef[2]))
        if self.surface_body is not None and not at_height and self.timer >= SNAG_WAIT:
            step_away_from_snag(self, sim, seen.lo[2])
        if self.slotted:
            release = at_height and xy_err < SLOT_ALIGN
        elif self.onto_object:
            release = (at_height and xy_err < PLACE_ALIGN) or self.timer >= PLACE_WAIT
        else:
            release = at_height
        if release:
            self.phase, self.timer = Phase.RELEASE, 0
        return goal, CLOSE

    def _command(self, sim, raw: dict, seen: Seen, goal: np.ndarray, gripper: float, yaw_err: float) -> np.ndarray:
        """The OSC_POSE action towards ``goal`` in the phase the step ended in: the fingers turned across the object
        while picking, or into the slot's direction while holding it."""
        eef = seen.eef
        delta = (goal - eef) / POS_SCALE
        action = np.zeros(7)
        action[:3] = np.clip(delta * 1.5, -1.0, 1.0)
        if self.phase == Phase.DESCEND:
            # come down slowly and keep the hand centred: fast vertical moves make the arm drift sideways
            action[:2] = np.clip(delta[:2] * 3.0, -1.0, 1.0)
            fast = self.fast_descent and eef[2] > seen.grasp_z + FAST_DESCENT
            action[2] = np.clip(delta[2] * 1.5, -1.0 if fast else -0.5, 0.5)
        if self.phase in (Phase.ALIGN, Phase.DESCEND, Phase.GRASP):
            action[5] = np.clip(3.0 * yaw_err, -1.0, 1.0)
        elif self.phase in (Phase.LIFT, Phase.CARRY, Phase.LOWER) and self.place_yaw is not None:
            place_err = yaw_error(sim, self.place_yaw)
            action[5] = np.clip(3.0 * place_err, -1.0, 1.0)
            far = self.slotted and np.linalg.norm(goal[:2] - eef[:2]) > SLOT_ALIGN
            if self.phase == Phase.LOWER and (abs(place_err) > 0.08 or far):
                action[2] = max(action[2], 0.0)  # turned into the slot's direction and over it before going down
        if self.slotted and self.phase in (Phase.LIFT, Phase.CARRY, Phase.LOWER):
            action[3:5] = level_hand(raw["robot0_eef_quat"])  # upright into the slot (elsewhere: measured worse)
        action[6] = gripper
        return action
