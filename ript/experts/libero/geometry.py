"""What the LIBERO experts know of the Panda hand and its controller, and how they read the scene's geometry from
the simulator: body and site ids, collision-geometry boxes, obstacles around a path, a handle's grasp, an object's
narrow side, the hand's orientation.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial.transform import Rotation

from ript.errors import RiptError

POS_SCALE = 0.05  # metres per unit action of OSC_POSE's position delta (its output_max)
OPEN, CLOSE = -1.0, 1.0
MAX_GRASP_WIDTH = 0.07  # the Panda hand opens to about 8 cm
HAND_HALF_SPAN = 0.10  # the Panda hand reaches this far each way along the fingers' closing direction
HAND_HALF_WIDTH = 0.035  # ... and this far each way across it (its thickness)
HAND_CLEARANCE = 0.02  # room around the hand that needs no turn of the grasp
FINGER_BELOW = 0.013  # the closed fingertips reach this far below the grip site
# the hand pointing into a drawer, fingers one above the other: its lower edge under the grip site (measured in
# that pose: 10.6 cm, where HAND_HALF_SPAN rounds to 10) and how far it reaches back from the grip site
HAND_HALF_HEIGHT, HAND_BACK = HAND_HALF_SPAN + 0.006, 0.126


def body_id(model, name: str) -> int:
    import mujoco

    i = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, name)
    if i < 0:
        raise RiptError(f"LIBERO scene has no body {name!r}")
    return i


def site_id(model, name: str) -> int:
    import mujoco

    i = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, name)
    if i < 0:
        raise RiptError(f"LIBERO scene has no site {name!r}")
    return i


_BOX_SIGNS = np.array(np.meshgrid([-1, 1], [-1, 1], [-1, 1])).reshape(3, -1).T


def is_collision_geom(model, g: int) -> bool:
    return not (model.geom_contype[g] == 0 and model.geom_conaffinity[g] == 0)  # else a visual-only mesh


def geom_box_corners(model, data, g: int) -> np.ndarray:
    """World coordinates of the 8 corners of geom ``g``'s bounding box."""
    center, half = model.geom_aabb[g, :3], model.geom_aabb[g, 3:]
    return data.geom_xpos[g] + (center + _BOX_SIGNS * half) @ data.geom_xmat[g].reshape(3, 3).T


def top_body(model, g: int) -> int:
    """The child of the world that geom ``g`` hangs from (a whole object, the robot, a piece of furniture)."""
    b = int(model.geom_bodyid[g])
    while int(model.body_parentid[b]) != 0:
        b = int(model.body_parentid[b])
    return b


def in_subtree(model, g: int, root: int) -> bool:
    """Whether geom ``g`` belongs to body ``root`` or a body under it."""
    b = int(model.geom_bodyid[g])
    while b not in (0, root):
        b = int(model.body_parentid[b])
    return b == root


ROBOT_BODIES = ("robot", "gripper", "mount")  # name prefixes of the robot's top bodies


def collision_corners(sim, body: str) -> np.ndarray:
    """World coordinates of the corners of each collision geom's bounding box in ``body``'s subtree."""
    model, data = sim.model._model, sim.data._data
    root = body_id(model, body)
    pts = [geom_box_corners(model, data, g) for g in range(model.ngeom)
           if is_collision_geom(model, g) and in_subtree(model, g, root)]
    if not pts:
        raise RiptError(f"LIBERO body {body!r} has no collision geometry")
    return np.concatenate(pts)


def snag_direction(sim, body: str, above: float) -> np.ndarray | None:
    """The unit xy direction away from where ``body``'s subtree touches something other than the robot higher
    than ``above`` (a rim caught under a handle, not the floor it stands on); None where nothing does."""
    model, data = sim.model._model, sim.data._data
    root = body_id(model, body)
    centre = data.xpos[root][:2]
    away = np.zeros(2)
    for i in range(data.ncon):
        c = data.contact[i]
        for mine, other in ((c.geom1, c.geom2), (c.geom2, c.geom1)):
            if (c.pos[2] > above and in_subtree(model, mine, root) and not in_subtree(model, other, root)
                    and not (model.body(top_body(model, other)).name or "").startswith(ROBOT_BODIES)):
                d = centre - c.pos[:2]
                away += d / max(float(np.linalg.norm(d)), 1e-6)
    n = float(np.linalg.norm(away))
    return away / n if n > 1e-6 else None


class ObstacleBoxes:
    """Other objects' collision geoms reaching between two heights, as oriented boxes (each geom's own
    bounding box in its frame: a rotated cabinet's walls are thin, not their loose world-axis boxes). The
    robot, the table and the floor are left out."""
    CHUNK = 4096  # fingers scored per array operation: (CHUNK, samples, boxes, 3) floats

    def __init__(self, sim, exclude: set[str], z_lo: float, z_hi: float):
        import mujoco

        model, data = sim.model._model, sim.data._data
        skip = tuple(f"{e}_" for e in exclude) + ROBOT_BODIES + ("floor", "world")
        self.z_lo, self.z_hi = z_lo, z_hi
        centers, rotations, halves = [], [], []
        for g in range(model.ngeom):
            if not is_collision_geom(model, g):
                continue
            b = top_body(model, g)
            name = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, b) or ""
            if b == 0 or name.startswith(skip) or name.endswith("table"):  # (a study's is "study_table")
                continue
            z = geom_box_corners(model, data, g)[:, 2]
            if z.max() > z_lo and z.min() < z_hi:
                rot = data.geom_xmat[g].reshape(3, 3)
                centers.append(data.geom_xpos[g] + rot @ model.geom_aabb[g, :3])
                rotations.append(rot.copy())
                halves.append(model.geom_aabb[g, 3:].copy())
        self.centers = np.array(centers).reshape(-1, 3)
        self.rotations = np.array(rotations).reshape(-1, 3, 3)
        self.halves = np.array(halves).reshape(-1, 3)

    def _gaps(self, xys: np.ndarray, samples: int) -> np.ndarray:
        """(len(xys), samples, boxes): each box's distance from each height sample of a vertical finger at each
        xy, the fingers taken CHUNK at a time (a planner scores thousands of placements at once)."""
        zs = np.linspace(self.z_lo, self.z_hi, samples)
        out = np.empty((len(xys), samples, len(self.centers)))
        for start in range(0, len(xys), self.CHUNK):
            xy = xys[start:start + self.CHUNK]
            points = np.empty((len(xy), samples, 3))
            points[..., :2], points[..., 2] = xy[:, None], zs
            local = np.einsum("bji,npbj->npbi", self.rotations, points[:, :, None, :] - self.centers)
            out[start:start + len(xy)] = np.linalg.norm(np.maximum(np.abs(local) - self.halves, 0.0), axis=-1)
        return out

    def distances(self, xys, samples: int = 5) -> np.ndarray:
        """Distance from a vertical finger at each of ``xys`` (n x 2; spanning the two heights) to the nearest
        box."""
        xys = np.asarray(xys, dtype=float).reshape(-1, 2)
        if not len(self.centers):
            return np.full(len(xys), np.inf)
        return self._gaps(xys, samples).min(axis=(1, 2))

    def distance(self, xy: np.ndarray, samples: int = 5) -> float:
        """Distance from a vertical finger at ``xy`` (spanning the two heights) to the nearest box."""
        return float(self.distances(xy, samples)[0])

    def top_near(self, xy: np.ndarray, radius: float) -> float:
        """The highest top of the boxes within ``radius`` of a vertical finger at ``xy`` (``z_lo`` where none are)."""
        if not len(self.centers):
            return self.z_lo
        tops = self.centers[:, 2] + np.einsum("bj,bj->b", np.abs(self.rotations[:, 2, :]), self.halves)
        near = self._gaps(np.reshape(xy, (1, 2)), 5)[0].min(0) < radius
        return float(max(self.z_lo, *tops[near])) if near.any() else self.z_lo


def handle_grasp(sim, body: str) -> tuple[np.ndarray, float, float]:
    """(grip xy, grip height, finger direction) on ``body``'s handle: its collision geoms farthest (horizontally)
    from the body's centre of mass, gripped across their narrow side, 1.5 cm under their top."""
    model, data = sim.model._model, sim.data._data
    root = body_id(model, body)
    com = data.xipos[root][:2]
    parts = []
    for g in range(model.ngeom):
        if int(model.geom_bodyid[g]) == root and is_collision_geom(model, g):
            corners = geom_box_corners(model, data, g)
            parts.append((float(np.linalg.norm(corners[:, :2].mean(0) - com)), corners))
    if not parts:
        raise RiptError(f"LIBERO body {body!r} has no collision geometry")
    farthest = max(d for d, _ in parts)
    handle = np.concatenate([c for d, c in parts if d >= 0.75 * farthest])
    yaw, _ = narrow_direction(handle)
    return (handle[:, :2].min(0) + handle[:, :2].max(0)) / 2, float(handle[:, 2].max()) - 0.015, yaw


def site_position(sim, name: str) -> np.ndarray:
    return sim.data._data.site_xpos[site_id(sim.model._model, name)].copy()


def narrow_direction(corners: np.ndarray) -> tuple[float, float]:
    """The horizontal direction (angle, radians) across which the footprint is narrowest, and that width."""
    angles = np.linspace(0.0, np.pi, 72, endpoint=False)
    dirs = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    proj = corners[:, :2] @ dirs.T
    widths = proj.max(0) - proj.min(0)
    i = int(np.argmin(widths))
    return float(angles[i]), float(widths[i])


def rotation_matrix(quat_xyzw: np.ndarray) -> np.ndarray:
    """The rotation matrix of a quaternion in robosuite's (x, y, z, w) order (scipy's too; MuJoCo's is w first)."""
    return Rotation.from_quat(quat_xyzw).as_matrix()


def rotation_vector(r: np.ndarray) -> np.ndarray:
    """Axis x angle of a rotation matrix (angles below pi). Written out rather than scipy's ``as_rotvec``, which
    reads the angle another way (through a quaternion) and differs by up to 1e-8: enough to change the demos."""
    angle = float(np.arccos(np.clip((np.trace(r) - 1) / 2, -1.0, 1.0)))
    if angle < 1e-6:
        return np.zeros(3)
    axis = np.array([r[2, 1] - r[1, 2], r[0, 2] - r[2, 0], r[1, 0] - r[0, 1]]) / (2 * np.sin(angle))
    return axis * angle


def pose_action(goal: np.ndarray, eef: np.ndarray, rot_err: np.ndarray, gripper: float) -> np.ndarray:
    """An OSC_POSE action that moves the hand toward ``goal`` and turns it by ``rot_err`` (an axis-angle in the
    world frame), each clipped to the controller's range, with ``gripper`` (OPEN or CLOSE)."""
    action = np.zeros(7)
    action[:3] = np.clip((goal - eef) / POS_SCALE * 1.5, -1.0, 1.0)
    action[3:6] = np.clip(rot_err * 2.0, -1.0, 1.0)
    action[6] = gripper
    return action


def level_hand(quat_xyzw: np.ndarray) -> np.ndarray:
    """The roll and pitch actions that turn the hand back to pointing straight down. OSC_POSE's rotation deltas
    with nothing commanded hold whatever tilt the hand has drifted to (a fast turn about the vertical tilts it:
    a held book came to lean 25 degrees and no longer fit its compartment). Used while a held object is turned
    into a slot; on every pick and place it lost more (a rim-pinched bowl, a mug, a pan by its handle) than it won."""
    approach = rotation_matrix(quat_xyzw)[:, 2]  # the hand's pointing direction, in the world
    return np.clip(2.0 * np.cross(approach, [0.0, 0.0, -1.0])[:2], -1.0, 1.0)


def finger_angle(sim) -> float:
    """The horizontal direction (radians) from the gripper's left finger to its right one."""
    model, data = sim.model._model, sim.data._data
    d = data.xpos[body_id(model, "gripper0_rightfinger")] - data.xpos[body_id(model, "gripper0_leftfinger")]
    return float(np.arctan2(d[1], d[0]))


def wrap_half_turn(a: float) -> float:
    """An angle difference folded into [-pi/2, pi/2): a parallel gripper is symmetric under a half turn."""
    return (a + np.pi / 2) % np.pi - np.pi / 2


WRIST_JOINT = "robot0_joint7"  # turns the hand about its pointing axis; its qpos falls as the fingers' yaw grows
WRIST_MARGIN = 0.15  # radians kept from the wrist joint's limits


def yaw_error(sim, target: float) -> float:
    """The turn (radians) that brings the fingers' direction to ``target`` (either way round: the hand is symmetric
    under a half turn): the shorter one, or, for a turn of more than an eighth, the longer one where the shorter
    would take the wrist's last joint past its limit. A quarter turn can go either way, and the way it went drove
    the wrist into its stop: the arm then wandered 40 cm while lifting (libero_90 KITCHEN_SCENE10, the pudding
    turned for its drawer). Small turns always go the short way (near the stop, a few degrees' correction turned
    the hand round the long way, to and fro)."""
    import mujoco

    err = wrap_half_turn(target - finger_angle(sim))
    model, data = sim.model._model, sim.data._data
    j = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, WRIST_JOINT)
    q, (lo, hi) = float(data.qpos[model.jnt_qposadr[j]]), model.jnt_range[j]

    def fits(turn: float) -> bool:
        return lo + WRIST_MARGIN <= q - turn <= hi - WRIST_MARGIN

    other = err - np.pi * np.sign(err)
    return other if abs(err) > np.pi / 4 and not fits(err) and fits(other) else err


def hand_turn(task, pointing: np.ndarray, across: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the hand's rotation now, the rotation that points it along ``pointing`` with the fingers along ``across``
    or ``-across``, whichever needs the smaller turn: the hand is symmetric). The two directions are found in the
    gripper's own frame from its bodies, so a target frame can be written for them."""
    model, data = task.sim.model._model, task.sim.data._data
    eef = task.privileged()["robot0_eef_pos"]
    hand = data.xpos[body_id(model, "gripper0_right_gripper")]
    left = data.xpos[body_id(model, "gripper0_leftfinger")]
    right = data.xpos[body_id(model, "gripper0_rightfinger")]
    r0 = rotation_matrix(task.privileged()["robot0_eef_quat"])
    approach = (eef - hand) / np.linalg.norm(eef - hand)  # hand -> fingertips, in the world
    fingers = (right - left) / np.linalg.norm(right - left)
    a_local, f_local = r0.T @ approach, r0.T @ fingers
    local = np.stack([a_local, f_local, np.cross(a_local, f_local)], axis=1)
    turns = [np.stack([pointing, f, np.cross(pointing, f)], axis=1) @ local.T for f in (across, -across)]
    return r0, min(turns, key=lambda r: np.linalg.norm(rotation_vector(r @ r0.T)))
