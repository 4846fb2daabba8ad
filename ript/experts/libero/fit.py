"""Fitting a held object into a walled goal region (a LIBERO expert's placement): the region's walls, the room an
object's outline has between them, the shift from the region's centre that gives it most, and the turn that squares
it up with a box region it only just fits.

A caddy's square compartment is 1.2 cm wider than a book is long, and its site sits 6 mm off the walls' centre;
an open drawer's region reaches back under the furniture over it, where the hand cannot come down.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ript.experts.libero.geometry import (
    ObstacleBoxes,
    body_id,
    collision_corners,
    narrow_direction,
    site_id,
    snag_direction,
    wrap_half_turn,
)

# a held object goes down into a walled region shifted by up to MAX_SHIFT from the region's centre, to where its
# outline has the most room from the walls, when at the centre it has less than WALL_ROOM
MAX_SHIFT, WALL_ROOM = 0.02, 0.01
DRAWER_SHIFT = 0.06  # ... and up to this much in an open drawer, out from under the furniture over its back
SNAG_STEP, SNAG_MAX = 0.005, 0.025  # a stuck object's goal moves this far per step away, this far in all
SLOT_PLAY = 0.03  # a held object this much narrower than a box region fits it turned any way; closer, it is squared up


class Placement(Protocol):
    """What fitting reads and moves of a placing expert (``pick_place.PickPlaceExpert``): its object and goal, how
    it holds the object, and the shift of its goal point it keeps."""

    obj: str
    target: str | None
    target_site: str | None
    surface_body: str | None
    rim: np.ndarray | None
    grasp_yaw: float
    hang: float
    clearance: float
    shift: np.ndarray
    unsnagged: float
    timer: int

    def goal_point(self, sim) -> tuple[np.ndarray, float]:
        """Where the object goes and the height of the surface it goes onto there."""
        ...


def level_axes(sim, site: int) -> list[tuple[np.ndarray, float]]:
    """A box site's two local axes that lie level (a drawer's region stands on its side: its local x is the
    world's vertical), each as (its unit horizontal direction in the world, the box's half extent along it)."""
    model, data = sim.model._model, sim.data._data
    rot = data.site_xmat[site].reshape(3, 3)
    level = sorted(range(3), key=lambda a: abs(rot[2, a]))[:2]
    return [(rot[:2, a] / np.linalg.norm(rot[:2, a]), float(model.site_size[site][a])) for a in sorted(level)]


def slot_yaw(expert: Placement, sim, obj_pts: np.ndarray) -> float | None:
    """For a goal region that is a box narrower than the held object is wide (a caddy's compartment), the
    finger direction that turns the object's narrow side across the region's narrow side; for one barely wider
    (within SLOT_PLAY), the nearer finger direction that squares the object up with the region; else None (the
    object keeps the yaw it was picked with). Fingers close across the object's narrow side, so turning the
    hand by an angle turns the object by it."""
    if expert.target is None or expert.target_site is None or expert.rim is not None:
        return None
    import mujoco

    model = sim.model._model
    i = site_id(model, expert.target_site)
    if model.site_type[i] != mujoco.mjtGeom.mjGEOM_BOX:
        return None
    axes = level_axes(sim, i)
    narrow = min(half for _, half in axes)
    object_width = float(np.ptp((obj_pts[:, :2] - obj_pts[:, :2].mean(0)) @ np.array(
        [-np.sin(expert.grasp_yaw), np.cos(expert.grasp_yaw)])))  # along the object's wide side
    if object_width <= 2 * narrow - SLOT_PLAY:
        return None  # fits whichever way it is turned
    turns = [min(axes, key=lambda axis: axis[1])]  # the region's narrow axis
    if object_width <= 2 * narrow:
        # within SLOT_PLAY of fitting: squared up with the region, either way, where its walls leave the object
        # too little room turned as it is (a book in a square compartment; not a bottle in a wide tray)
        tgt_xy, tgt_top = expert.goal_point(sim)
        walls = goal_walls(expert, sim, tgt_top)
        if walls is None or outline_room(walls[0], obj_pts[:, :2] - obj_pts[:, :2].mean(0), [tgt_xy])[0] >= WALL_ROOM:
            return None
        turns = axes
    yaws = [float(np.arctan2(d[1], d[0])) for d, _ in turns]
    return min(yaws, key=lambda y: abs(wrap_half_turn(y - expert.grasp_yaw)))


def goal_walls(expert: Placement, sim, tgt_top: float) -> tuple[ObstacleBoxes, float, np.ndarray] | None:
    """The walls around the goal region, as obstacles up to where the held object is let go (in a drawer, up to
    where it is carried: the furniture over the drawer's back meets the hand on the way down), how far the
    object may be shifted from the region's centre (MAX_SHIFT; DRAWER_SHIFT in a drawer) and the region's
    half extent in the world; None for a region with no walls (a plate, a table region)."""
    if expert.target is None or expert.target_site is None:
        return None
    model, data = sim.model._model, sim.data._data
    site = site_id(model, expert.target_site)
    half = np.abs(data.site_xmat[site].reshape(3, 3)) @ model.site_size[site]
    bottom = float(data.site_xpos[site][2] - half[2])
    if tgt_top < bottom + 0.03:
        return None
    reach, top = MAX_SHIFT, tgt_top
    if expert.surface_body is not None:
        reach, top = DRAWER_SHIFT, tgt_top + expert.hang + expert.clearance
    return ObstacleBoxes(sim, {expert.obj}, bottom + 0.02, top), reach, half


def outline_room(walls: ObstacleBoxes, outline: np.ndarray, points: list[np.ndarray]) -> list[float]:
    """The least distance from the walls to an outline (xy) put at each of ``points``: along its convex hull's
    edges every few millimetres, since a corner can be past a thin wall while the edge is across it."""
    corners = outline[[int(np.argmax(outline @ [np.cos(a), np.sin(a)]))
                       for a in np.linspace(0, 2 * np.pi, 16, endpoint=False)]]
    rim = np.concatenate([a + (b - a) * t[:, None] for a, b in zip(corners, np.roll(corners, -1, axis=0))
                          for t in [np.linspace(0, 1, max(2, int(np.linalg.norm(b - a) / 0.004)), endpoint=False)]])
    placed = (np.asarray(points, dtype=float)[:, None, :] + rim).reshape(-1, 2)
    return list(walls.distances(placed, samples=3).reshape(len(points), len(rim)).min(1))


def roomiest_shift(expert: Placement, sim, outline: np.ndarray, tgt_xy: np.ndarray, tgt_top: float) -> np.ndarray:
    """The shift from ``tgt_xy`` (within the walls' reach, the region's centre kept inside the region: LIBERO's
    In tests it) that gives the held object's outline the most room from the region's walls; none where the
    centre leaves it WALL_ROOM or the region has no walls."""
    found = goal_walls(expert, sim, tgt_top)
    if found is None or outline_room(found[0], outline, [tgt_xy])[0] >= WALL_ROOM:
        return np.zeros(2)
    walls, reach, half = found
    grid = np.arange(-reach, reach + 1e-9, 0.004)
    inside = np.maximum(half[:2] - 0.01, 0.0)
    shifts = [np.array([dx, dy]) for dx in grid for dy in grid if abs(dx) <= inside[0] and abs(dy) <= inside[1]]
    rooms = outline_room(walls, outline, [tgt_xy + d for d in shifts])
    return shifts[int(np.argmax([r - 0.01 * float(np.linalg.norm(d)) for r, d in zip(rooms, shifts)]))]


def region_spot(sim, site: str, obj: str, index: int, count: int) -> np.ndarray:
    """Where the ``index``-th of ``count`` objects bound for one box region goes, from the region's centre: side by
    side along the region's axis closest to ``obj``'s narrow direction, at least the object's narrow width and 1 cm
    apart, so the second object is not released on top of the first (both moka pots onto the stove)."""
    angle, width = narrow_direction(collision_corners(sim, f"{obj}_main"))
    direction, half = max(level_axes(sim, site_id(sim.model._model, site)),
                          key=lambda axis: abs(axis[0] @ np.array([np.cos(angle), np.sin(angle)])))
    spacing = max(2 * half / count, width + 0.01)
    return direction * spacing * (index - (count - 1) / 2)


def step_away_from_snag(expert: Placement, sim, bottom: float) -> None:
    """Lowered into a drawer and stuck above its floor (the rim caught under a handle of the furniture over it):
    move the goal a step away from what the object touches, along the drawer's slide only (sideways the object
    tips onto a side wall), at most SNAG_MAX in all."""
    if expert.unsnagged + SNAG_STEP > SNAG_MAX + 1e-9:
        return  # (before reading the contacts: called on every step an object stays stuck)
    away = snag_direction(sim, f"{expert.obj}_main", bottom + 0.01)
    model, data = sim.model._model, sim.data._data
    joint = int(model.body_jntadr[body_id(model, expert.surface_body)])
    if away is not None and joint >= 0:
        slide = data.xaxis[joint][:2]
        along = float(away @ slide) / max(float(slide @ slide), 1e-9)
        away = np.sign(along) * slide / np.linalg.norm(slide) if abs(along) > 1e-3 else None
    if away is not None:
        expert.shift = expert.shift + SNAG_STEP * away
        expert.unsnagged += SNAG_STEP
        expert.timer = 0
