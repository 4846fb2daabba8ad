"""Scripted LIBERO episodes driven in the test process."""

from __future__ import annotations


def drive_scripted_demo(suite: str, task_name: str, demo: int, limit: int, check=None) -> tuple[bool, int]:
    """Run the expert of a LIBERO task on one demo's layout with that demo's action noise (as ``ript collect`` and
    ``benchmarks.libero_experts`` draw them, seed 0) until the task is done or ``limit`` steps; ``check(task, expert,
    step)`` is called before every step. Returns (success, steps)."""
    import numpy as np

    from ript.envs.libero import LiberoTask
    from ript.envs.seeds import demo_layout_seed, demo_noise_rng
    from ript.experts.libero.goals import make_expert

    task = LiberoTask(suite, task_name, None)
    try:
        task.reset(demo_layout_seed(0, demo, 0), render=False)
        expert, rng, steps = make_expert(task), demo_noise_rng(0, task_name, demo, 0), 0
        while not task.done and steps < limit:
            if check is not None:
                check(task, expert, steps)
            action = expert.get_action(task)
            action[:6] = np.clip(action[:6] + rng.normal(0.0, 0.05, 6), -1.0, 1.0)
            task.step(action, render=False)
            steps += 1
        return bool(task.success), steps
    finally:
        task.close()


def scripted_libero_episode(suite: str, task_name: str, demo: int | None = None):
    """(the expert a LIBERO task gets at layout 0, one scripted demo of it there with noise 0.05), on the real
    simulator; with ``demo``, the layout and noise of that demo as ``ript collect`` and
    ``benchmarks.libero_experts`` draw them (seed 0) instead."""
    import numpy as np

    from ript.envs.libero import LiberoTask
    from ript.envs.seeds import demo_layout_seed, demo_noise_rng
    from ript.experts.libero.episode import run_episode
    from ript.experts.libero.goals import make_expert

    layout, rng = 0, np.random.default_rng(0)
    if demo is not None:
        layout, rng = demo_layout_seed(0, demo, 0), demo_noise_rng(0, task_name, demo, 0)
    task = LiberoTask(suite, task_name, None)
    try:
        task.reset(layout, render=False)
        expert = make_expert(task)
        return expert, run_episode(task, layout, rng, 0.05, render=False)
    finally:
        task.close()
