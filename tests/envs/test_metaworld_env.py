import numpy as np
import pytest

from ript.envs.metaworld import INSTRUCTIONS, MetaWorldTask, RenderSettings, benchmark_tasks, expert_policy
from ript.errors import RiptError


def test_benchmark_task_lists_and_instructions():
    train, test = benchmark_tasks("ML45", "train"), benchmark_tasks("ML45", "test")
    assert len(train) == 45 and len(test) == 5 and not set(train) & set(test)
    assert set(benchmark_tasks("MT50")) == set(INSTRUCTIONS)
    with pytest.raises(RiptError, match="ML99"):
        benchmark_tasks("ML99")


def test_seeded_layouts_step_and_render():
    render = RenderSettings(cameras=("corner", "gripperPOV"), image_size=32, quality="low")
    task = MetaWorldTask("button-press-v3", render, max_episode_steps=20)
    try:
        a = task.reset(5)
        b = task.reset(5)
        c = task.reset(6)
        assert np.array_equal(a["env_state"], b["env_state"])
        assert not np.array_equal(a["env_state"], c["env_state"])
        assert a["corner_rgb"].shape == (32, 32, 3) and a["corner_rgb"].dtype == np.uint8
        assert a["robot_states"].shape == (4,)
        policy = expert_policy("button-press-v3")
        obs, steps = task.reset(5), 0
        while not task.done:
            obs, _, done, info = task.step(policy.get_action(obs["env_state"].astype(np.float64)), render=False)
            steps += 1
            assert "corner_rgb" not in obs  # no image unless asked
        assert steps <= 20
        # stepping past the end is a no-op, not an error
        again, reward, done, _ = task.step(np.zeros(4))
        assert done and reward == 0.0 and np.array_equal(again["env_state"], obs["env_state"])
    finally:
        task.close()


def test_corner_camera_is_flipped_upright():
    flipped = MetaWorldTask("reach-v3", RenderSettings(cameras=("corner",), image_size=32, flip_cameras=("corner",)))
    raw = MetaWorldTask("reach-v3", RenderSettings(cameras=("corner",), image_size=32, flip_cameras=()))
    try:
        assert np.array_equal(flipped.reset(0)["corner_rgb"], raw.reset(0)["corner_rgb"][::-1])
    finally:
        flipped.close()
        raw.close()


def test_unknown_task_and_camera():
    with pytest.raises(RiptError, match="unknown MetaWorld task 'pick-plaec-v3'"):
        MetaWorldTask("pick-plaec-v3", None)
    with pytest.raises(RiptError, match="unknown camera 'nope'"):
        MetaWorldTask("reach-v3", RenderSettings(cameras=("nope",), image_size=32))


def test_cameras_rendered_side_by_side_match_mujocos_renderer_camera_by_camera():
    """MetaWorldTask draws all cameras into one buffer and reads it back once: the first camera's pixels are
    mujoco.Renderer's, the second's (drawn at another offset) differ at most on a few triangle-edge pixels."""
    import mujoco

    task = MetaWorldTask("drawer-close-v3", RenderSettings(image_size=64, quality="low"), 50)
    reference = mujoco.Renderer(task.env.model, 64, 64)
    for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION, mujoco.mjtRndFlag.mjRND_SKYBOX):
        reference.scene.flags[flag] = 0
    differing = {cam: 0 for cam in task.render_settings.cameras}
    try:
        task.reset(3)
        for step in range(20):
            task.step(np.array([0.3, -0.2, 0.1 * np.sin(step), 0.0]))
            images = task.render_images()
            for cam in task.render_settings.cameras:
                reference.update_scene(task.env.data, camera=cam)
                expected = reference.render()
                expected = expected[::-1] if cam in task.render_settings.flip_cameras else expected
                assert expected.std() > 5  # a real picture, not a blank buffer
                differing[cam] += int((images[f"{cam}_rgb"] != expected).any(-1).sum())
    finally:
        reference.close()
        task.close()
    first, second = task.render_settings.cameras
    assert differing[first] == 0
    assert differing[second] <= 0.001 * 20 * 64 * 64


def test_tasks_sharing_one_gl_context_render_as_with_their_own():
    """An env worker's tasks draw in one GL context (built faster than each in a context of its own): the frames
    are the same, with the tasks' renders interleaved and after one of them has closed."""
    from ript.envs.rendering import SharedGLContext

    render = RenderSettings(cameras=("corner", "gripperPOV"), image_size=32, quality="low")
    shared = SharedGLContext()
    names = ["button-press-v3", "drawer-close-v3"]
    together = [MetaWorldTask(n, render, 20, shared) for n in names]
    alone = [MetaWorldTask(n, render, 20) for n in names]
    try:
        assert together[0]._renderer.gl is together[1]._renderer.gl is shared.context
        assert alone[0]._renderer.gl is not alone[1]._renderer.gl
        first = [t.reset(3) for t in together]
        again = together[0].reset(3)  # after the other task drew in the same context
        for a, b, mine in zip(first, [t.reset(3) for t in alone], ["button", "drawer"]):
            for key in ("corner_rgb", "gripperPOV_rgb"):
                assert np.array_equal(a[key], b[key]), (mine, key)
        assert np.array_equal(again["corner_rgb"], first[0]["corner_rgb"])
        together[1].close()
        after = together[0].step(np.zeros(4))[0]
        assert after["corner_rgb"].shape == (32, 32, 3) and after["corner_rgb"].any()
    finally:
        for t in together + alone:
            t.close()
        shared.close()
    assert shared.context is None
