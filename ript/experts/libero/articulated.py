"""Privileged-state scripted experts for LIBERO's articulated goals: ``Close`` (drawers, the microwave door),
``TurnOn`` / ``TurnOff`` (stove knobs), ``Open`` (drawers, the microwave door).

Each pushes the moving part with the closed gripper: the joint, its axis and its limits come from the
simulator, the part's shape from its collision geometry, and the target from the LIBERO object's own
open/close/on/off ranges, so the experts are not written per scene. A slide joint (a drawer) is pushed along
its axis at its outermost point (the handle); a hinge (a door, a knob's lever) at the point farthest from its
axis, tangentially, the fingertip following the arc. The push target is kept a few centimetres beyond the
part, so the compliant OSC controller presses on it until the goal predicate holds. A drawer is opened by
grasping its handle's bar with the hand turned level and pulling along the slide, a door by grasping its
upright bar and pulling it along its arc.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial.transform import Rotation

from ript.errors import RiptError
from ript.experts.base import Phase, SequenceExpert
from ript.experts.libero.geometry import (
    CLOSE,
    HAND_BACK,
    HAND_HALF_HEIGHT,
    HAND_HALF_WIDTH,
    collision_corners,
    hand_turn,
    pose_action,
    rotation_matrix,
    rotation_vector,
)
from ript.experts.libero.joints import FREE, SLIDE, Articulation, joint_for
from ript.experts.libero.leaning import LeaningPullExpert, LeaningPushExpert, is_low_drawer, ungraspable_handle
from ript.experts.libero.push import HOLD_STEPS, HOVER, JointPushExpert

AJAR = 0.4  # radians a door is pulled open by its handle before it is pushed from behind
MAX_RISE = 0.03  # the most the hand comes in above a handle to pass over what stands in front of the furniture


class PullOpenExpert:
    """Open a drawer or a door by its handle: turn the hand to point into it with the fingers across the
    handle's bar (one above the other for a level bar: a top grasp would hit the drawer above), come in level
    with the handle, close the fingers around the bar, pull until LIBERO's open test holds, let go and back
    away. Subclasses say which geom is the handle and which way it is pulled now.

    Phases: turn, approach, insert, grasp, pull, release, away."""

    APPROACH_OUT = 0.10  # the hand lines up this far out along the pull before it comes in to the handle

    def __init__(self, task, articulation: Articulation, done):
        self.art, self.done = articulation, done
        self.phase, self.timer, self.rot_err = Phase.TURN, 0, np.inf
        model, data = task.sim.model._model, task.sim.data._data
        # LIBERO's open test is a threshold near one joint limit: pull toward the side where it holds
        self.sign = -1.0 if done(self.art.qpos - 10.0) else 1.0
        _, self.pull = self.art.contact(self.sign)
        # the fingers across the handle's bar: vertical for a level bar, level for an upright one (a door's),
        # whichever way round needs the smaller turn (the hand is symmetric)
        g = self.handle_geom
        bar = data.geom_xmat[g].reshape(3, 3)[:, int(np.argmax(model.geom_aabb[g, 3:]))]
        across = np.array([0.0, 0.0, 1.0])
        if abs(bar[2]) > 0.7:
            across = np.cross(-self.pull, bar)
            across /= np.linalg.norm(across)
        r0, self.target_rot = hand_turn(task, -self.pull, across)
        self.start_rot = r0  # turned back to at the end: the next expert expects the hand pointing down
        self.start_qpos = self.art.qpos
        self.rise: float | None = None  # how far above the handle the hand comes in (set on approach)
        # in a set-aside sequence (three steps in the time of two): lined up over the approach while turning to
        # the handle, and turned back down as soon as the open fingers are off it
        self.hurried = False

    @property
    def finished(self) -> bool:
        return self.phase == Phase.AWAY and self.timer > 10 and self.rot_err < 0.1

    @property
    def handle_geom(self) -> int:
        raise NotImplementedError

    def _grip(self) -> tuple[np.ndarray, np.ndarray]:
        """(the handle's centre, the unit horizontal direction it is pulled in now)."""
        raise NotImplementedError

    def _hand_rotation(self) -> np.ndarray:
        """The hand's target orientation while it works the handle."""
        return self.target_rot

    def _rise(self, sim, handle: np.ndarray, pull: np.ndarray) -> float:
        """How far above the handle the hand comes in: enough for its lower edge to pass over the loose objects
        standing in its way in front of the furniture (a plate before a middle drawer), at most MAX_RISE."""
        import mujoco

        model = sim.model._model
        across = np.array([-pull[1], pull[0], 0.0])
        top = -np.inf
        for joint in range(model.njnt):
            if int(model.jnt_type[joint]) != FREE:  # only loose objects have a free joint
                continue
            body = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, int(model.jnt_bodyid[joint]))
            corners = collision_corners(sim, body)
            u, v = (corners - handle) @ pull, (corners - handle) @ across
            if (u.max() > -0.02 and u.min() < self.APPROACH_OUT + HAND_BACK
                    and v.max() > -HAND_HALF_WIDTH - 0.01 and v.min() < HAND_HALF_WIDTH + 0.01):
                top = max(top, float(corners[:, 2].max()))
        lower_edge = handle[2] - HAND_HALF_HEIGHT
        return float(np.clip(top + 0.005 - lower_edge, 0.0, MAX_RISE)) if np.isfinite(top) else 0.0

    def get_action(self, task) -> np.ndarray:
        raw = task.privileged()
        eef = raw["robot0_eef_pos"]
        handle, pull = self._grip()
        # the hand turned back down after 10 steps out and up, or (hurried) as soon as the open fingers are off the
        # handle (for every opening, together with a faster descent everywhere: libero_90 419 -> 411/450, the
        # microwave door 4/5 -> 2/5)
        turning_back = self.phase == Phase.AWAY and self.timer > (4 if self.hurried else 10)
        rot_err = rotation_vector((self.start_rot if turning_back else self._hand_rotation())
                                   @ rotation_matrix(raw["robot0_eef_quat"]).T)
        self.rot_err = float(np.linalg.norm(rot_err)) if turning_back else np.inf
        gripper, goal = -1.0, eef.copy()
        if self.phase == Phase.TURN:  # in place, away from the furniture (up to above the handle if lower: the
            over = handle[2] + HOVER  # hand may have just set something down on the table)
            goal[2] = max(eef[2], over)
            # hurried, it lines up over the approach while it turns, once risen clear of what it may have just set
            # down (moving across at once, it swept a bowl set aside back under the drawer)
            if self.hurried and eef[2] > over - 0.01:
                goal[:2] = (handle + pull * self.APPROACH_OUT)[:2]
            if np.linalg.norm(rot_err) < 0.1:
                self.phase = Phase.APPROACH
        elif self.phase == Phase.APPROACH:
            if self.rise is None:
                self.rise = self._rise(task.sim, handle, pull)
            goal = handle + pull * self.APPROACH_OUT + np.array([0.0, 0.0, self.rise])
            if self.rise > 0 and np.linalg.norm(goal[:2] - eef[:2]) > 0.015:  # across at the turn's height,
                goal[2] = max(goal[2], eef[2])  # then down: the lower edge would sweep what stands there
            if np.linalg.norm(goal - eef) < 0.015:
                self.phase = Phase.INSERT
        elif self.phase == Phase.INSERT:  # in above the handle by the rise, down to it once at the furniture
            at_face = float((eef - handle) @ pull) < 0.015
            goal = handle - pull * 0.005 + np.array([0.0, 0.0, 0.0 if at_face else self.rise])
            self.timer += 1
            if np.linalg.norm(goal - eef) < 0.008 or self.timer > 40:
                self.phase, self.timer = Phase.GRASP, 0
        elif self.phase == Phase.GRASP:
            goal, gripper = handle - pull * 0.005, CLOSE
            self.timer += 1
            if self.timer >= 12:
                self.phase, self.timer = Phase.PULL, 0
        elif self.phase == Phase.PULL:
            goal, gripper = handle + pull * 0.05, CLOSE
            self.timer = self.timer + 1 if self.done(self.art.qpos) else 0
            if self.timer >= HOLD_STEPS:
                self.phase, self.timer = Phase.RELEASE, 0
        elif self.phase == Phase.RELEASE:
            self.timer += 1
            if self.timer > 8:
                self.phase, self.timer = Phase.AWAY, 0
        else:  # out along the pull and up, then the hand turned back down
            goal = eef + (pull * 0.03 + np.array([0.0, 0.0, 0.02]) if self.timer <= 10 else 0.0)
            self.timer += 1
        return pose_action(goal, eef, rot_err, gripper)


class SlideOpenExpert(PullOpenExpert):
    """A drawer: the handle is its outermost geom along the slide, pulled straight out."""

    def _handle_index(self, centers: np.ndarray) -> int:
        return int(np.argmax(centers @ self.pull))  # the outermost geom along the pull

    @property
    def handle_geom(self) -> int:
        return self.art.geoms[self._handle_index(self.art.centers())]

    def _grip(self) -> tuple[np.ndarray, np.ndarray]:
        centers = self.art.centers()
        return centers[self._handle_index(centers)], self.pull

    def swept(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """The drawer's footprint from now until open, as a box in the frame of the pull: (pull, across,
        [[pull lo, hi], [across lo, hi]], its lowest height)."""
        q0, step = self.art.qpos, 0.005 * (1.0 if self.done(self.art.qpos + 10.0) else -1.0)
        q = q0
        while not self.done(q) and abs(q - q0) < 1.0:
            q += step
        travel = abs(q - q0) + 0.02  # the pull goes on a little while the test holds
        corners = self.art.corners()
        across = np.array([-self.pull[1], self.pull[0], 0.0])
        u, v = corners @ self.pull, corners @ across
        box = np.array([[u.min(), u.max() + travel], [v.min(), v.max()]])
        return self.pull, across, box, float(corners[:, 2].min())


class HingeOpenExpert(PullOpenExpert):
    """A door (the microwave's): the handle is the geom farthest from the hinge, pulled along its arc (the
    fingers hold an upright bar loosely enough for it to turn between them)."""

    @property
    def handle_geom(self) -> int:
        return self.art.geoms[self.art.farthest()]

    def _grip(self) -> tuple[np.ndarray, np.ndarray]:
        return self.art.contact(self.sign)

    def _hand_rotation(self) -> np.ndarray:
        # turned with the door, so the fingers keep pointing into it (a fixed hand meets the turning door's face)
        turn = Rotation.from_rotvec((self.art.qpos - self.start_qpos) * self.art.axis()).as_matrix()
        return turn @ self.target_rot


def articulated_expert(task, pred: tuple[str, ...]):
    """The expert for one ``(open X)`` (a drawer, a door) / ``(close X)`` / ``(turnon X)`` / ``(turnoff X)``
    goal, with LIBERO's own thresholds."""
    kind, name = pred[0], pred[1]
    obj, joint = joint_for(task, name)
    art = Articulation(task, joint)
    ranges = obj.object_properties["articulation"]
    if kind == "open":
        if art.kind == SLIDE:

            opener = SlideOpenExpert(task, art, obj.is_open)
            handle, pull = opener._grip()
            if ungraspable_handle(float(handle[2]), float(collision_corners(task.sim, f"{obj.name}_main")[:, 2].min())):
                # a bottom drawer's handle 4.6 cm over the table
                return LeaningPullExpert(task, art, obj.is_open, opener.handle_geom, pull)
            return opener
        # a door: pulled by its handle until ajar (the bar slips from the fingers as it turns past ~30 degrees),
        # then pushed the rest of the way from behind, where the gap now lets the fingertip in
        q0 = art.qpos
        sign = -1.0 if obj.is_open(q0 - 10.0) else 1.0
        return SequenceExpert([HingeOpenExpert(task, art, lambda q: (q - q0) * sign > AJAR),
                               JointPushExpert(art, sign, obj.is_open)])
    if kind == "close":
        # LIBERO's test is a threshold near the joint's closed limit: push toward the side where it holds
        sign = 1.0 if obj.is_close(art.qpos + 10.0) else -1.0

        if art.kind == SLIDE and is_low_drawer(art, float(collision_corners(task.sim, f"{obj.name}_main")[:, 2].max())):
            return LeaningPushExpert(task, art, sign, obj.is_close)
        return JointPushExpert(art, sign, obj.is_close)
    if kind == "turnon":
        return JointPushExpert(art, 1.0, lambda q: obj.turn_on(q) and q > min(ranges["default_turnon_ranges"]) + 0.15)
    if kind == "turnoff":
        return JointPushExpert(art, -1.0, obj.turn_off)
    return _no_expert(task, pred)


def _no_expert(task, pred: tuple[str, ...]):
    raise RiptError(f"{task.suite}/{task.task_name}: no scripted expert for the goal ({' '.join(pred)})")
