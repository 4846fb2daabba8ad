"""LIBERO experts that lay a held object down: along a goal region that leans (the wine rack's top region, whose
"up" axis is 62 degrees from vertical, holds a bottle only lying along its slanted tray), and flat into a drawer
too shallow for it standing (``DrawerLayExpert``).

LIBERO's ``On`` for such a region (``SiteObject.under``) tests the object's body origin in the region's own
frame: within the region's extent across, and at most 10 cm along the region's "up" axis. So the object is
picked by its top with the fingers closing along the region's long axis, lifted clear of the target, tilted
about the fingers' axis until its own axis lies along the region's "up" (a rotation about the grip axis keeps
both fingers beside the object, neither between it and the tray), and laid on the tray from above it.
"""

from __future__ import annotations

import numpy as np

from ript.experts.base import Phase
from ript.experts.libero.geometry import CLOSE, OPEN, POS_SCALE, body_id, collision_corners, site_id
from ript.experts.libero.pick_place import PickPlaceExpert

SLANTED = np.deg2rad([30, 75])  # an On goal's region whose "up" leans this far from vertical gets this expert
# (a drawer's region "up" is horizontal: LIBERO tests In for it by containment, not by this frame)
TILT_RATE = 0.4  # largest rotation action while tilting (OSC_POSE: x 0.5 rad per step)
TILT_TOLERANCE = 0.05  # radians
LAY_ABOVE = 0.08  # the held object approaches its resting place from this far above the tray
CLEAR = 0.05  # the object's bottom passes this far above the target's top
SIDE = 0.6  # laid at this fraction of the region's half-length from its centre (a rack's middle post)


def region_up(sim, site: str) -> np.ndarray:
    data = sim.data._data
    return data.site_xmat[site_id(sim.model._model, site)].reshape(3, 3)[:, 2].copy()


def is_slanted(sim, site: str) -> bool:
    lean = float(np.arccos(np.clip(region_up(sim, site)[2], -1.0, 1.0)))
    return bool(SLANTED[0] < lean < SLANTED[1])


class SlantedPlaceExpert(PickPlaceExpert):
    """Pick ``obj`` by its top and lay it along the leaning region ``site`` of ``target``.

    Phases: align, descend, grasp (as ``PickPlaceExpert``), raise, tilt, over, lay, release."""

    def __init__(self, obj: str, target: str, site: str):
        super().__init__(obj, target, site)
        self.reach = 0.0  # grip site to the object's body origin, along the object's axis
        self.hold: np.ndarray | None = None  # where the hand stays while it tilts
        self.lay: np.ndarray | None = None  # where the object's body origin comes to rest
        self.upright = np.array([0.0, 0.0, 1.0])  # the object's axis in its body frame (set at the grasp)

    def _frame(self, sim) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(site position, the region's long axis, its "up" along the tray, the tray's upward normal)."""
        model, data = sim.model._model, sim.data._data
        i = site_id(model, self.target_site)
        rot = data.site_xmat[i].reshape(3, 3)
        long_axis, up = rot[:, 0], rot[:, 2]
        normal = np.cross(long_axis, up)
        return data.site_xpos[i].copy(), long_axis, up, normal if normal[2] > 0 else -normal

    def _plan_grasp(self, sim, obj_pts: np.ndarray, obj_xy: np.ndarray) -> None:
        _, long_axis, _, _ = self._frame(sim)
        self.grasp_yaw, self.rim = float(np.arctan2(long_axis[1], long_axis[0])), None

    def _lay_point(self, sim) -> np.ndarray:
        """Where the object's body origin rests: off the region's centre towards the side the object comes from
        (decided once, before it is carried over), a little up the tray and a bottle's radius above it."""
        site, long_axis, up, normal = self._frame(sim)
        half = float(sim.model._model.site_size[site_id(sim.model._model, self.target_site)][0])
        start = sim.data._data.xpos[body_id(sim.model._model, f"{self.obj}_main")]
        side = 1.0 if (start - site) @ long_axis >= 0 else -1.0
        return site + side * SIDE * half * long_axis + 0.015 * up + 0.02 * normal

    def get_action(self, task) -> np.ndarray:
        sim = task.sim
        model, data = sim.model._model, sim.data._data
        body = body_id(model, f"{self.obj}_main")
        if self.phase in (Phase.ALIGN, Phase.DESCEND, Phase.GRASP):
            action = super().get_action(task)
            if self.phase == Phase.LIFT:
                # the object's own axis, in its body frame, is the one that points up while it stands (a ketchup
                # bottle's body z lies sideways)
                self.phase, self.upright = Phase.RAISE, data.xmat[body].reshape(3, 3)[2].copy()
            return action
        eef = task.privileged()["robot0_eef_pos"]
        axis, origin = data.xmat[body].reshape(3, 3) @ self.upright, data.xpos[body]
        _, long_axis, up, normal = self._frame(sim)
        # tilt about the long axis (the fingers' axis), measured in the plane across it
        across = np.cross(long_axis, [0.0, 0.0, 1.0])
        tilt = np.arctan2(axis @ across, axis[2])
        tilt_error = np.arctan2(up @ across, up[2]) - tilt
        turn = np.clip(2.0 * tilt_error, -TILT_RATE, TILT_RATE)
        gripper, goal = CLOSE, eef.copy()
        if self.phase == Phase.RAISE:
            turn = 0.0
            top = float(collision_corners(sim, f"{self.target}_main")[:, 2].max())
            goal = np.array([eef[0], eef[1], top + float((eef - origin) @ axis) + CLEAR])
            if eef[2] > goal[2] - 0.03:
                self.phase, self.hold, self.lay = Phase.TILT, eef.copy(), self._lay_point(sim)
        elif self.phase == Phase.TILT:
            goal = self.hold
            if abs(tilt_error) < TILT_TOLERANCE:
                self.phase, self.reach = Phase.OVER, float((eef - origin) @ axis)
        else:
            rest = self.lay + self.reach * axis  # the hand where the origin rests (axis is a unit vector)
            if self.phase == Phase.OVER:
                goal = rest + LAY_ABOVE * normal
                if np.linalg.norm(goal - eef) < 0.015:
                    self.phase, self.timer = Phase.LAY, 0
            elif self.phase == Phase.LAY:
                goal, self.timer = rest, self.timer + 1
                if np.linalg.norm(goal - eef) < 0.01 or self.timer > 60:
                    self.phase, self.timer = Phase.RELEASE, 0
            else:  # release, then back off along the tray's normal
                gripper, self.timer = OPEN, self.timer + 1
                goal = eef + (0.05 * normal if self.timer > 10 else 0.0)
        action = np.zeros(7)
        action[:3] = np.clip((goal - eef) / POS_SCALE * 1.5, -1.0, 1.0)
        action[3:6] = turn * long_axis  # OSC_POSE's rotation delta is an axis-angle in the world frame
        action[6] = gripper
        return action


def region_box(sim, site: str) -> tuple[np.ndarray, np.ndarray]:
    """(centre, world half-extents) of a box region as LIBERO's ``in_box`` tests it: the site's size turned by
    its rotation, axis by axis."""
    model, data = sim.model._model, sim.data._data
    i = site_id(model, site)
    return data.site_xpos[i].copy(), np.abs(data.site_xmat[i].reshape(3, 3) @ model.site_size[i])


def too_tall_for(sim, obj: str, site: str) -> bool:
    """Whether ``obj`` standing on the floor of the box region ``site`` would have its body origin above the
    region's top, so that LIBERO's ``In`` (the origin inside the box) fails: a bottle in a shallow drawer."""
    centre, half = region_box(sim, site)
    body = body_id(sim.model._model, f"{obj}_main")
    origin_height = float(sim.data._data.xpos[body][2] - collision_corners(sim, f"{obj}_main")[:, 2].min())
    return centre[2] - half[2] + origin_height > centre[2] + half[2] - 0.01


class DrawerLayExpert(SlantedPlaceExpert):
    """Pick ``obj`` by its top with the fingers closing across the drawer region's long side, tilt it about them
    until it lies along the region's long side, its top away from the robot, hold it over the region's centre just
    above the drawer's walls and let it drop in flat."""

    def _frame(self, sim) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        centre, half = region_box(sim, self.target_site)
        along = np.array([1.0, 0.0, 0.0]) if half[0] >= half[1] else np.array([0.0, 1.0, 0.0])
        across = np.array([along[1], along[0], 0.0])
        robot = sim.data._data.xpos[body_id(sim.model._model, "robot0_base")]
        # the held top (and the hand) away from the robot: the wrist's last bend has room that way (turning the
        # top towards the robot runs it into its 3.75 rad limit)
        up = along if (robot - centre) @ along < 0 else -along
        return centre, across, up, np.array([0.0, 0.0, 1.0])

    def _lay_point(self, sim) -> np.ndarray:
        centre, half = region_box(sim, self.target_site)
        pts = collision_corners(sim, f"{self.obj}_main")
        thickness = float(np.ptp(pts[:, :2] @ self._frame(sim)[1][:2]))  # lying, its width across the fingers
        return np.array([centre[0], centre[1], centre[2] + half[2] + thickness / 2 + 0.02])
