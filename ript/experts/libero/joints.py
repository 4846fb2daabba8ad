"""LIBERO's joints as the scripted experts see them: ``Articulation`` (one joint's position, axis and the
collision geometry that moves with it) and the scene queries that find the joint a goal names, whether a region
is inside a closed drawer, and the body a drawer's region moves with."""

from __future__ import annotations

import numpy as np

from ript.errors import RiptError
from ript.experts.libero.geometry import geom_box_corners, in_subtree, is_collision_geom

FREE, SLIDE, HINGE = 0, 2, 3  # MuJoCo joint types


class Articulation:
    """One joint of a LIBERO object: its qpos, the world direction in which qpos grows at a point, and the
    collision geoms that move with it."""

    def __init__(self, task, joint: str):
        import mujoco

        self.sim = task.sim
        model = self.sim.model._model
        self.joint = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, joint)
        if self.joint < 0:
            raise RiptError(f"{task.suite}/{task.task_name}: LIBERO scene has no joint {joint!r}")
        self.kind = int(model.jnt_type[self.joint])
        if self.kind not in (SLIDE, HINGE):
            raise RiptError(f"{task.suite}/{task.task_name}: joint {joint!r} is neither a slide nor a hinge")
        self.body = int(model.jnt_bodyid[self.joint])
        self.geoms = [g for g in range(model.ngeom)
                      if is_collision_geom(model, g) and in_subtree(model, g, self.body)]
        if not self.geoms:
            raise RiptError(f"{task.suite}/{task.task_name}: joint {joint!r} moves no collision geometry")

    @property
    def qpos(self) -> float:
        model, data = self.sim.model._model, self.sim.data._data
        return float(data.qpos[model.jnt_qposadr[self.joint]])

    def axis(self) -> np.ndarray:
        data = self.sim.data._data
        return data.xaxis[self.joint].copy()

    def corners(self) -> np.ndarray:
        model, data = self.sim.model._model, self.sim.data._data
        return np.concatenate([geom_box_corners(model, data, g) for g in self.geoms])

    def centers(self) -> np.ndarray:
        model, data = self.sim.model._model, self.sim.data._data
        return np.array([data.geom_xpos[g] + data.geom_xmat[g].reshape(3, 3) @ model.geom_aabb[g, :3]
                         for g in self.geoms])

    def _radial(self, points: np.ndarray) -> np.ndarray:
        """From a hinge's axis to each point, square to the axis."""
        anchor, axis = self.sim.data._data.xanchor[self.joint], self.axis()
        radial = points - anchor
        return radial - np.outer(radial @ axis, axis)

    def farthest(self) -> int:
        """Index of the moving geom farthest from the hinge's axis (a door's handle, a knob's lever)."""
        return int(np.argmax(np.linalg.norm(self._radial(self.centers()), axis=1)))

    def contact(self, sign: float) -> tuple[np.ndarray, np.ndarray]:
        """(point to push, unit horizontal push direction) that moves qpos in the direction of ``sign``."""
        centers = self.centers()
        if self.kind == SLIDE:
            push = sign * self.axis()
            push[2] = 0.0
            push /= np.linalg.norm(push)
            return centers[int(np.argmax(centers @ -push))], push  # the outermost part: the handle
        far = self.farthest()
        radial = self._radial(centers)
        push = sign * np.cross(self.axis(), radial[far])
        push[2] = 0.0
        return centers[far], push / np.linalg.norm(push)


def _region_joint(task, region: str) -> str | None:
    """The joint a region moves with (a drawer's slide), or None for a region that does not move."""
    site = task.env.env.object_sites_dict.get(region)
    return site.joints[0] if site is not None and getattr(site, "joints", None) else None


def joint_for(task, name: str) -> tuple[object, str]:
    """(the LIBERO object, its joint) a goal names: an object (``flat_stove_1``, ``microwave_1``) or one of
    its regions (``wooden_cabinet_1_top_region``: the drawer's joint)."""
    env = task.env.env
    joint = _region_joint(task, name)
    if joint is not None:
        return env.get_object(env.object_sites_dict[name].parent_name), joint
    obj = env.get_object(name)
    joints = getattr(obj, "joints", None) if obj is not None else None
    if not joints:
        raise RiptError(f"{task.suite}/{task.task_name}: {name!r} has no joint to move")
    return obj, joints[0]


def closed_container(task, region: str) -> bool:
    """Whether ``region`` is inside something with a joint (a drawer) that is not open now: an (In X region)
    goal then needs an (Open region) first, though the BDDL goal does not list one."""
    return _region_joint(task, region) is not None and not task.env.env.object_states_dict[region].is_open()


def drawer_body(task, region: str) -> str | None:
    """The body that moves with ``region`` (a drawer's), whose floor and walls an object put in it lands on;
    None for a region that does not move."""
    import mujoco

    joint = _region_joint(task, region)
    if joint is None:
        return None
    model = task.sim.model._model
    j = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, joint)
    return mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, int(model.jnt_bodyid[j]))
