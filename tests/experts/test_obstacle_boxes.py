"""The LIBERO experts' obstacle distances (``ObstacleBoxes``) on hand-placed boxes: a batch of fingers scored at once,
across chunk boundaries, gives each finger's own distance, and that distance is the Euclidean gap to the box."""

from __future__ import annotations

import numpy as np

from ript.experts.libero.geometry import ObstacleBoxes


def boxes(centers, yaws, halves, z_lo=0.0, z_hi=0.2) -> ObstacleBoxes:
    """Boxes as ``ObstacleBoxes`` holds a scene's geoms, placed by hand instead of read from a simulator."""
    walls = object.__new__(ObstacleBoxes)
    walls.z_lo, walls.z_hi = z_lo, z_hi
    walls.centers = np.asarray(centers, dtype=float).reshape(-1, 3)
    walls.rotations = np.array([[[np.cos(y), -np.sin(y), 0], [np.sin(y), np.cos(y), 0], [0, 0, 1]] for y in yaws])
    walls.rotations = walls.rotations.reshape(-1, 3, 3)
    walls.halves = np.asarray(halves, dtype=float).reshape(-1, 3)
    return walls


def test_a_batch_of_fingers_scores_each_as_alone_and_as_the_gap_to_the_nearest_box():
    walls = boxes([[0.0, 0.0, 0.1], [0.5, 0.2, 0.1]], [0.0, np.pi / 4], [[0.1, 0.05, 0.1], [0.05, 0.05, 0.3]])
    walls.CHUNK = 7  # several chunks and a short last one
    xys = np.random.default_rng(0).uniform(-0.5, 1.0, (30, 2))
    batch = walls.distances(xys, samples=3)
    assert batch.shape == (30,)
    assert np.array_equal(batch, [walls.distance(xy, samples=3) for xy in xys])
    # the axis-aligned box spans the fingers' heights: the gap is the horizontal one; inside it, none
    assert abs(walls.distance(np.array([-0.4, 0.0])) - 0.3) < 1e-12
    assert abs(walls.distance(np.array([-0.4, 0.45])) - np.hypot(0.3, 0.4)) < 1e-12
    assert walls.distance(np.array([0.05, 0.0])) == 0.0
    # the turned box: 0.1 from its centre along its own x axis (45 degrees) is 0.05 past its face
    along = np.array([0.5, 0.2]) + 0.1 * np.array([np.cos(np.pi / 4), np.sin(np.pi / 4)])
    assert abs(boxes([[0.5, 0.2, 0.1]], [np.pi / 4], [[0.05, 0.05, 0.3]]).distance(along) - 0.05) < 1e-12


def test_no_boxes_is_no_obstacle():
    walls = boxes([], [], [])
    assert np.all(walls.distances(np.zeros((4, 2))) == np.inf)
    assert walls.top_near(np.zeros(2), 0.1) == walls.z_lo
