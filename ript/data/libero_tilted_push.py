"""Closing a low drawer with the hand leaning into the push (a LIBERO expert).

Pushed with the hand pointing straight down, a bottom drawer (its top 14 cm under the cabinet's) stops 8 cm short
of closed: the forearm, above and behind the low fingertips, meets the cabinet's front over the drawer. Leaning
the hand 45 degrees towards the push, fingers closed and side by side, keeps the wrist and forearm back and up
while the fingertips follow the drawer's front in; the hand passes over what stands in front of the drawer (a
bowl) instead of sweeping through it as a level hand would.
"""

from __future__ import annotations

import numpy as np

from ript.data.libero_articulated import (APPROACH, FINGER_BELOW, HOLD_STEPS, HOVER, PUSH_AHEAD, Articulation,
                                          _rotation_vector, hand_turn)
from ript.data.libero_geometry import CLOSE, POS_SCALE, rotation_matrix

LOW_PART = 0.10  # a drawer whose top is this far under its furniture's top is pushed with the hand leaning
LEAN = np.deg2rad(45.0)  # the hand's pointing direction, down from level towards the push


def is_low_drawer(art: Articulation, furniture_top: float) -> bool:
    return float(art.corners()[:, 2].max()) < furniture_top - LOW_PART


class LeaningPushExpert:
    """Push a slide until ``done(qpos)`` holds with the hand leaning LEAN into the push: turn over the start, come
    down in front of the part at its handle's height, push (re-aimed every step), hold, back away and turn the
    hand back down."""

    def __init__(self, task, articulation: Articulation, sign: float, done, lean: float = LEAN):
        self.art, self.sign, self.done = articulation, sign, done
        self.phase, self.timer, self.rot_err = "turn", 0, np.inf
        _, push = articulation.contact(sign)
        pointing = np.cos(lean) * push + np.sin(lean) * np.array([0.0, 0.0, -1.0])
        self.lean = lean
        across = np.cross(np.array([0.0, 0.0, 1.0]), push)
        r0, self.target_rot = hand_turn(task, pointing, across / np.linalg.norm(across))
        self.start_rot = r0  # turned back to at the end: the next expert expects the hand pointing down

    @property
    def finished(self) -> bool:
        return self.phase == "away" and self.timer > 10 and self.rot_err < 0.1

    def get_action(self, task) -> np.ndarray:
        raw = task.privileged()
        eef = raw["robot0_eef_pos"]
        point, push = self.art.contact(self.sign)
        corners = self.art.corners()
        lo, hi = float(corners[:, 2].min()), float(corners[:, 2].max())
        # the fingertips (FINGER_BELOW along the lean from the grip site) at the handle, above the drawer's floor
        height = float(np.clip(point[2], lo + 0.02, hi - 0.005)) + FINGER_BELOW * np.sin(self.lean)
        start = np.array([*(point[:2] - push[:2] * (APPROACH + FINGER_BELOW)), height])
        turning_back = self.phase == "away" and self.timer > 10
        rot_err = _rotation_vector((self.start_rot if turning_back else self.target_rot)
                                   @ rotation_matrix(raw["robot0_eef_quat"]).T)
        self.rot_err = float(np.linalg.norm(rot_err)) if turning_back else np.inf
        goal = eef.copy()
        if self.phase == "turn":  # over the start, clear of the part
            goal = np.array([*start[:2], max(eef[2], hi + HOVER)])
            if np.linalg.norm(rot_err) < 0.1 and np.linalg.norm(goal[:2] - eef[:2]) < 0.015:
                self.phase = "descend"
        elif self.phase == "descend":
            goal = start
            self.timer += 1
            if np.linalg.norm(goal - eef) < 0.012 or self.timer > 40:  # (or blocked a little above it)
                self.phase, self.timer = "push", 0
        elif self.phase == "push":
            goal = np.array([*(point[:2] + push[:2] * (PUSH_AHEAD - FINGER_BELOW)), height])
            self.timer = self.timer + 1 if self.done(self.art.qpos) else 0
            if self.timer >= HOLD_STEPS:
                self.phase, self.timer = "away", 0
        else:  # back out against the push and up, then the hand turned back down
            goal = eef + (np.array([*(-push[:2] * 0.03), 0.02]) if self.timer <= 10 else 0.0)
            self.timer += 1
        action = np.zeros(7)
        action[:3] = np.clip((goal - eef) / POS_SCALE * 1.5, -1.0, 1.0)
        action[3:6] = np.clip(rot_err * 2.0, -1.0, 1.0)
        action[6] = CLOSE  # closed fingers: one compact fingertip to push with
        return action
