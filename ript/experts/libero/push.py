"""Pushing a part of the scene with the closed gripper's fingertip (a LIBERO expert's step): a drawer or a door
along its joint, a knob's lever round its axis, a box over or an object in past a shelf's front (any part with
``contact``, ``corners``, ``kind`` and ``qpos`` as ``joints.Articulation`` has them).
"""

from __future__ import annotations

import numpy as np

from ript.experts.base import Phase
from ript.experts.libero.geometry import CLOSE, FINGER_BELOW, POS_SCALE, yaw_error
from ript.experts.libero.joints import SLIDE, Articulation

PUSH_AHEAD = 0.03  # how far beyond the part the fingertip is sent (metres): the push force
APPROACH = 0.05  # the fingertip starts this far behind the part, against the push direction
HOVER = 0.06  # clearance above the moving part while getting into place
HOLD_STEPS = 5  # steps the goal must hold before the expert backs away


class JointPushExpert:
    """Push a joint until ``done(qpos)`` holds: get above the start point behind the part, come down to its
    height, push (re-aimed every step), hold, then lift away. With ``stop_at`` (a slide's qpos) the push is
    done there and aims no further ahead than the travel left: a drawer pushed part of the way in.

    Phases: above, descend, push, away."""

    def __init__(self, articulation: Articulation, sign: float, done, stop_at: float | None = None):
        self.art, self.sign, self.done, self.stop_at = articulation, sign, done, stop_at
        self.phase, self.timer = Phase.ABOVE, 0

    def _push_goal(self, point: np.ndarray, push: np.ndarray, eef: np.ndarray) -> np.ndarray:
        """Where the fingertip is sent while it pushes: PUSH_AHEAD beyond the part (the push's force), or with
        ``stop_at`` no further than the travel left from where the hand is (slowing as it nears the stop:
        pushed at full speed, a drawer coasted 2.5 cm past it)."""
        if self.stop_at is None:
            return point[:2] + push[:2] * PUSH_AHEAD
        left = float(np.clip((self.stop_at - self.art.qpos) * self.sign, 0.0, PUSH_AHEAD))
        return eef[:2] + push[:2] * left

    @property
    def finished(self) -> bool:
        return self.phase == Phase.AWAY and self.timer > HOLD_STEPS

    def get_action(self, task) -> np.ndarray:
        eef = task.privileged()["robot0_eef_pos"]
        point, push = self.art.contact(self.sign)
        corners = self.art.corners()
        # the grip site at the pushed geom's height, but with the fingertips (FINGER_BELOW under it) clear of
        # whatever the part stands on: a knob's disc, a door's bottom rail
        lo, hi = corners[:, 2].min(), corners[:, 2].max()
        # a drawer near its top edge: pushing a low drawer at its handle bends the arm into the furniture above
        aim = hi - 0.03 if self.art.kind == SLIDE else point[2]
        height = float(np.clip(aim, lo + 0.02 + FINGER_BELOW, hi - 0.005))
        start = np.array([*(point[:2] - push[:2] * APPROACH), height])
        if self.phase == Phase.ABOVE:
            goal = np.array([*start[:2], max(hi + HOVER, eef[2])])
            if np.linalg.norm(goal[:2] - eef[:2]) < 0.015:
                self.phase = Phase.DESCEND
        elif self.phase == Phase.DESCEND:
            goal = start
            self.timer += 1
            if abs(eef[2] - height) < 0.012 or self.timer > 40:  # (or blocked a little above it)
                self.phase, self.timer = Phase.PUSH, 0
        elif self.phase == Phase.PUSH:
            goal = np.array([*self._push_goal(point, push, eef), height])
            self.timer = self.timer + 1 if self.done(self.art.qpos) else 0
            if self.timer >= HOLD_STEPS:
                self.phase, self.timer = Phase.AWAY, 0
        else:  # back off against the push, then up
            goal = eef + np.array([*(-push[:2] * 0.03), 0.03])
            self.timer += 1
        action = np.zeros(7)
        action[:3] = np.clip((goal - eef) / POS_SCALE * 1.5, -1.0, 1.0)
        # the hand's long side (along the finger axis, ~21 cm) across the push, so it fits close to a cabinet
        across = float(np.arctan2(push[1], push[0])) + np.pi / 2
        action[5] = np.clip(3.0 * yaw_error(task.sim, across), -1.0, 1.0)
        action[6] = CLOSE  # closed fingers: one compact fingertip to push with
        return action
