"""Closing a low drawer with the hand leaning into the push, and opening one whose handle cannot be grasped with
the hand leaning over its bar (LIBERO experts).

Pushed with the hand pointing straight down, a bottom drawer (its top 14 cm under the cabinet's) stops 8 cm short
of closed: the forearm, above and behind the low fingertips, meets the cabinet's front over the drawer. Leaning
the hand 45 degrees towards the push, fingers closed and side by side, keeps the wrist and forearm back and up
while the fingertips follow the drawer's front in; the hand passes over what stands in front of the drawer (a
bowl) instead of sweeping through it as a level hand would.

A bottom drawer's handle 4.6 cm over the table cannot be grasped: the hand reaches 10.6 cm each way along its
closing direction, and whichever way it holds the level bar one end meets the table or the cabinet's face; pointing
straight down over the bar, its palm meets the handle of the drawer above. Leaning 45 degrees into the drawer, the
closed fingertips come down on the bar's top, press on it and pull: the drawer follows.
"""

from __future__ import annotations

import numpy as np

from ript.experts.base import Phase
from ript.experts.libero.geometry import (
    CLOSE,
    FINGER_BELOW,
    HAND_HALF_HEIGHT,
    geom_box_corners,
    hand_turn,
    pose_action,
    rotation_matrix,
    rotation_vector,
)
from ript.experts.libero.joints import Articulation
from ript.experts.libero.push import APPROACH, HOLD_STEPS, HOVER, PUSH_AHEAD

LOW_PART = 0.10  # a drawer whose top is this far under its furniture's top is pushed with the hand leaning
LEAN = np.deg2rad(45.0)  # the hand's pointing direction, down from level towards the push
PRESS = 0.02  # how far under the bar's top the leaning fingertips are sent: the pressure that drags the drawer
PULL_AHEAD = 0.06  # how far ahead of the bar, along the pull, the pressing fingertips are sent
PRESS_STEPS = 15  # steps pressing on the bar before the pull


def is_low_drawer(art: Articulation, furniture_top: float) -> bool:
    return float(art.corners()[:, 2].max()) < furniture_top - LOW_PART


class LeaningHand:
    """What the leaning experts share: the hand turned to lean down from level towards a horizontal direction,
    fingers closed and side by side across it, and turned back down once it has backed away (the next expert
    expects it pointing down). Subclasses run the phases; ``away`` is the last."""

    phase: Phase
    timer: int

    def _lean(self, task, towards: np.ndarray, lean: float) -> np.ndarray:
        """Set the turn that leans the hand ``lean`` towards ``towards``; returns the pointing direction."""
        pointing = np.cos(lean) * towards + np.sin(lean) * np.array([0.0, 0.0, -1.0])
        across = np.cross(np.array([0.0, 0.0, 1.0]), towards)
        self.start_rot, self.target_rot = hand_turn(task, pointing, across / np.linalg.norm(across))
        self.rot_err = np.inf
        return pointing

    @property
    def finished(self) -> bool:
        return self.phase == Phase.AWAY and self.timer > 10 and self.rot_err < 0.1

    def _rotation_error(self, raw: dict) -> np.ndarray:
        """The rotation still to make: to the lean, or back down once 10 steps away."""
        turning_back = self.phase == Phase.AWAY and self.timer > 10
        err = rotation_vector((self.start_rot if turning_back else self.target_rot)
                              @ rotation_matrix(raw["robot0_eef_quat"]).T)
        self.rot_err = float(np.linalg.norm(err)) if turning_back else np.inf
        return err


class LeaningPushExpert(LeaningHand):
    """Push a slide until ``done(qpos)`` holds with the hand leaning LEAN into the push: turn over the start, come
    down in front of the part at its handle's height, push (re-aimed every step), hold, back away and turn the
    hand back down.

    Phases: turn, descend, push, away."""

    def __init__(self, task, articulation: Articulation, sign: float, done, lean: float = LEAN):
        self.art, self.sign, self.done = articulation, sign, done
        self.phase, self.timer = Phase.TURN, 0
        _, push = articulation.contact(sign)
        self.lean = lean
        self._lean(task, push, lean)

    def get_action(self, task) -> np.ndarray:
        raw = task.privileged()
        eef = raw["robot0_eef_pos"]
        point, push = self.art.contact(self.sign)
        corners = self.art.corners()
        lo, hi = float(corners[:, 2].min()), float(corners[:, 2].max())
        # the fingertips (FINGER_BELOW along the lean from the grip site) at the handle, above the drawer's floor
        height = float(np.clip(point[2], lo + 0.02, hi - 0.005)) + FINGER_BELOW * np.sin(self.lean)
        start = np.array([*(point[:2] - push[:2] * (APPROACH + FINGER_BELOW)), height])
        rot_err = self._rotation_error(raw)
        goal = eef.copy()
        if self.phase == Phase.TURN:  # over the start, clear of the part
            goal = np.array([*start[:2], max(eef[2], hi + HOVER)])
            if np.linalg.norm(rot_err) < 0.1 and np.linalg.norm(goal[:2] - eef[:2]) < 0.015:
                self.phase = Phase.DESCEND
        elif self.phase == Phase.DESCEND:
            goal = start
            self.timer += 1
            if np.linalg.norm(goal - eef) < 0.012 or self.timer > 40:  # (or blocked a little above it)
                self.phase, self.timer = Phase.PUSH, 0
        elif self.phase == Phase.PUSH:
            goal = np.array([*(point[:2] + push[:2] * (PUSH_AHEAD - FINGER_BELOW)), height])
            self.timer = self.timer + 1 if self.done(self.art.qpos) else 0
            if self.timer >= HOLD_STEPS:
                self.phase, self.timer = Phase.AWAY, 0
        else:  # back out against the push and up, then the hand turned back down
            goal = eef + (np.array([*(-push[:2] * 0.03), 0.02]) if self.timer <= 10 else 0.0)
            self.timer += 1
        return pose_action(goal, eef, rot_err, CLOSE)  # closed fingers: one compact fingertip to push with


def ungraspable_handle(handle_z: float, furniture_bottom: float) -> bool:
    """Whether a drawer's handle is too low over what its furniture stands on for a hand to grasp it (its lower
    edge, coming in level, would be under the table)."""
    return handle_z - HAND_HALF_HEIGHT < furniture_bottom


class LeaningPullExpert(LeaningHand):
    """Open a drawer by its handle's bar without grasping it: turn the hand to lean LEAN into the drawer, fingers
    closed and side by side along the bar, come over the bar, press the fingertips on its top, pull along the slide
    until ``done(qpos)`` holds, then back away upwards and turn the hand back down.

    Phases: turn, over, press, pull, away."""

    def __init__(self, task, articulation: Articulation, done, handle: int, pull: np.ndarray):
        """``handle``: the bar's geom; ``pull``: the horizontal direction that opens the drawer (both as
        ``SlideOpenExpert`` finds them)."""
        self.art, self.done, self.handle, self.pull = articulation, done, handle, pull
        self.phase, self.timer = Phase.TURN, 0
        self.pointing = self._lean(task, -pull, LEAN)

    def get_action(self, task) -> np.ndarray:
        raw = task.privileged()
        eef = raw["robot0_eef_pos"]
        model, data = task.sim.model._model, task.sim.data._data
        bar = geom_box_corners(model, data, self.handle)
        top = np.array([*bar[:, :2].mean(0), bar[:, 2].max()])
        grip = top - self.pointing * FINGER_BELOW  # the grip site with the fingertips on the bar's top
        rot_err = self._rotation_error(raw)
        pressed = grip - np.array([0.0, 0.0, PRESS])
        goal = eef.copy()
        if self.phase == Phase.TURN:  # out along the pull and high, clear of the furniture
            goal = np.array([*(grip[:2] + self.pull[:2] * 0.08), max(eef[2], top[2] + 0.1)])
            if np.linalg.norm(rot_err) < 0.1 and np.linalg.norm(goal[:2] - eef[:2]) < 0.015:
                self.phase = Phase.OVER
        elif self.phase == Phase.OVER:
            goal = grip + np.array([0.0, 0.0, 0.04])
            self.timer += 1
            if np.linalg.norm(goal - eef) < 0.01 or self.timer > 40:
                self.phase, self.timer = Phase.PRESS, 0
        elif self.phase == Phase.PRESS:
            goal = pressed
            self.timer += 1
            if self.timer >= PRESS_STEPS:
                self.phase, self.timer = Phase.PULL, 0
        elif self.phase == Phase.PULL:
            goal = pressed + np.array([*(self.pull[:2] * PULL_AHEAD), 0.0])
            self.timer = self.timer + 1 if self.done(self.art.qpos) else 0
            if self.timer >= HOLD_STEPS:
                self.phase, self.timer = Phase.AWAY, 0
        else:  # up and back along the pull, then the hand turned back down
            goal = eef + (np.array([*(self.pull[:2] * 0.02), 0.03]) if self.timer <= 10 else 0.0)
            self.timer += 1
        return pose_action(goal, eef, rot_err, CLOSE)
