"""What a suite's scripted demonstrations are made of: an episode source per suite family (registered in
``ript.registry.EXPERTS``), and for LIBERO the planners it drives, each an ``Expert``.

An ``EpisodeSource`` is all ``ript.experts.collect`` needs of a suite family: open a task with its expert, run one
episode from a layout seed with the arm's action noise, and name the attributes of the task's demonstration file.
Which family a suite uses is the suite's own business (``ript.envs.suites.Suite.expert``).

An ``Expert`` is a LIBERO planner. It is built for one episode, after the task is reset (``goals.make_expert``
reads the placed scene: which objects, where, which drawer is open), so it has no ``reset``: a new episode gets a
new expert. It reads the simulator's privileged state through the task at every step rather than an observation,
because the plan depends on collision geometry, joints and sites that no observation carries. Its ``phase`` says
where it is in its plan; ``finished`` tells a sequence of experts when the next one may take over.
MetaWorld's own scripted policies (``metaworld.policies``) answer ``get_action(state)`` the same way.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Protocol

import numpy as np


class Phase(str, Enum):
    """The steps of the LIBERO planners' plans; each planner goes through some of them, in its own order (its
    docstring says which). A ``str`` so that a phase prints, compares and logs as its name."""

    ABOVE = "above"  # over the start of a push, clear of the part
    ALIGN = "align"  # over the grasp point, the fingers turned across the object
    APPROACH = "approach"  # lined up with a handle, out along the pull
    AWAY = "away"  # backing off a part it pushed or pulled
    CARRY = "carry"  # holding the object, on the way over its goal
    DESCEND = "descend"  # coming down to the grasp point or to the start of a push
    DROP = "drop"  # a turned object coming down to a layer's floor
    ENTER = "enter"  # sliding the held object into a layer through its open side
    GRASP = "grasp"  # closing the fingers
    INSERT = "insert"  # the hand going in to a handle
    LAY = "lay"  # laying the held object on its resting place
    LIFT = "lift"  # raising the grasped object
    LOWER = "lower"  # lowering the held object onto or into its goal
    OVER = "over"  # over where the held object is laid, or over a handle's bar
    PRESS = "press"  # pressing the fingertips on a handle's bar
    PULL = "pull"  # pulling a handle
    PUSH = "push"  # pushing a part along its joint
    RAISE = "raise"  # raising the held object clear of its goal before it is tilted
    RELEASE = "release"  # opening the fingers
    TILT = "tilt"  # tilting the held object in the hand
    TURN = "turn"  # turning the hand in place

    def __str__(self) -> str:
        return self.value


class Expert(Protocol):
    """A LIBERO planner: one episode's plan for one goal (or a sequence of goals), read off the simulator."""

    phase: Any  # a Phase, or for a sequence "<step>:<its phase>"

    @property
    def finished(self) -> bool:
        """Whether the plan is done: the goal holds and the hand has let go and backed off."""
        ...

    def get_action(self, task) -> np.ndarray:
        """The next OSC_POSE action (7: position delta, rotation delta, gripper) for the task's current state."""
        ...


class EpisodeSource(Protocol):
    """What runs a suite family's scripted episodes for ``ript collect``."""

    def open_task(self, task_name: str, suite: str, render: dict, max_episode_steps: int, compiled=None) -> Any:
        """A task of the suite, ready for ``run_episode`` (closed by the caller); ``compiled``: the collection's
        ``ript.envs.compiled_scenes.CompiledScenes`` (a suite that compiles no scenes ignores it)."""
        ...

    def run_episode(self, task, layout_seed: int, noise_rng: np.random.Generator, noise: float):
        """One expert episode from a fresh layout, as a ``ript.data.hdf5.Demo``."""
        ...

    def file_attrs(self, suite: str, task_name: str, render: dict, max_episode_steps: int) -> dict[str, Any]:
        """The attributes of the task's demonstration file."""
        ...


class SequenceExpert:
    """Experts one after another, each until it is finished (open the drawer, put the bowl inside, close it)."""

    def __init__(self, steps: list[Expert]):
        self.steps, self.index = steps, 0

    @property
    def phase(self) -> str:
        return f"{self.index}:{self.steps[self.index].phase}"

    @property
    def finished(self) -> bool:
        return self.index + 1 == len(self.steps) and self.steps[-1].finished

    def get_action(self, task) -> np.ndarray:
        if self.steps[self.index].finished and self.index + 1 < len(self.steps):
            self.index += 1
        return self.steps[self.index].get_action(task)
