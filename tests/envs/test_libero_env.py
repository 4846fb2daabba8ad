"""LIBERO on the real simulator: a task builds, resets from a packaged init state and steps; a file in the
official dataset layout trains through the same reader; the scripted expert collects a successful episode;
a tiny pipeline (stage 0, stage 1, one RL iteration) runs on those demonstrations."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import h5py
import numpy as np
import pytest

from ript.config import compose
from ript.errors import RiptError
from tests.helpers.cli import assert_round_trip

SUITE = "libero_object"
TASK = "pick_up_the_alphabet_soup_and_place_it_in_the_basket"


# one test process runs this file's tests (pytest-xdist, --dist loadgroup), so its module fixture is built once
pytestmark = pytest.mark.xdist_group("test_libero_env")


@pytest.fixture(scope="module")
def soup_task():
    from ript.envs.libero import LiberoRender, LiberoTask

    task = LiberoTask(SUITE, TASK, LiberoRender(image_size=32), max_episode_steps=6)
    yield task
    task.close()


def test_libero_task_resets_from_packaged_init_states_and_steps(soup_task):
    from ript.envs.libero import LIBERO_INIT_STATES, SETTLE_STEPS

    assert soup_task.instruction == "pick up the alphabet soup and place it in the basket"
    obs = soup_task.reset(10**9 + 3)
    assert obs["agentview_rgb"].shape == (32, 32, 3) and obs["eye_in_hand_rgb"].dtype == np.uint8
    assert obs["joint_states"].shape == (7,) and obs["gripper_states"].shape == (2,) and obs["ee_states"].shape == (6,)
    # the upright image is robosuite's rendering flipped vertically
    np.testing.assert_array_equal(obs["agentview_rgb"], soup_task.raw_images()["agentview_rgb"][::-1])
    # packaged state j: objects where the init state puts them (before the settle steps move them at all)
    soup_task.env.reset()
    soup_task.env.set_init_state(soup_task.init_states[3])
    placed = soup_task.sim.data.body_xpos[soup_task.sim.model.body_name2id("alphabet_soup_1_main")].copy()
    obs_again = soup_task.reset(10**9 + 3 + LIBERO_INIT_STATES)  # the same state, 50 seeds later
    np.testing.assert_allclose(soup_task.privileged()["alphabet_soup_1_pos"][:2], placed[:2], atol=0.01)
    np.testing.assert_allclose(obs_again["joint_states"], obs["joint_states"], atol=1e-6)
    assert soup_task.env.env.timestep == SETTLE_STEPS > 0  # the settle steps ran, after the last reset
    # demonstration seeds draw fresh placements: reproducible per seed, different across seeds
    states = []
    for seed in (5, 6, 5):
        soup_task.reset(seed)
        states.append(soup_task.sim_state()[1:])  # [0] is the sim time
    assert np.array_equal(states[0], states[2]) and not np.allclose(states[0], states[1])
    moved = None
    for _ in range(6):
        obs, reward, done, info = soup_task.step(np.array([0.0, 0.0, 1.0, 0.0, 0.0, 0.0, -1.0]), render=False)
        moved = obs
    assert done and not info["success"] and reward == 0.0 and "agentview_rgb" not in moved
    assert soup_task.step(np.zeros(7))[2]  # stepping past the end is a no-op that stays done


@pytest.mark.extended
def test_a_scene_taken_back_from_a_slots_cache_renders_and_steps_as_a_fresh_one():
    """A slot keeps several LIBERO scenes (``workers.tasks_per_slot``), each with its own GL context: going back
    to one after another was built gives the observations a fresh scene gives."""
    from ript.envs.libero import suite_tasks
    from ript.envs.worker_env import EpisodeSpec, TaskEnv

    first, other = suite_tasks(SUITE)[:2]
    render = {"cameras": ["agentview", "eye_in_hand"], "image_size": 32, "quality": "low"}
    chunk = np.tile(np.array([0.3, 0.0, -0.2, 0, 0, 0, -1], dtype=np.float32), (4, 1))

    def episode(env, task, seed):
        start = env.begin(EpisodeSpec(task, seed, 0))[0]
        return start, env.advance_chunk(chunk, 1, False)[0][-1][1]

    cached, fresh = TaskEnv(SUITE, render, 300, None, task_limit=2), TaskEnv(SUITE, render, 300, None, task_limit=1)
    try:
        episode(cached, first, 5)
        episode(cached, other, 1)
        again = episode(cached, first, 3)
        scene = cached.suite_entry.scene_of
        assert list(cached.tasks) == [scene(other), scene(first)]  # both kept, the one used last at the end
        for got, want in zip(again, episode(fresh, first, 3), strict=True):
            assert set(got) == set(want)
            for key in want:
                np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    finally:
        cached.close()
        fresh.close()


def test_tasks_of_one_scene_share_a_built_scene_and_run_as_in_a_fresh_one():
    """LIBERO-Goal's ten tasks share one scene: a slot that ran one runs another without building it, with the
    other's goal, instruction and objects of interest, and observations equal to a fresh build's (a stove left lit
    by the task before included)."""
    from ript.envs.libero import suite_tasks
    from ript.envs.suites import get_suite
    from ript.envs.worker_env import EpisodeSpec, TaskEnv

    goal, objects = get_suite("libero_goal"), get_suite(SUITE)
    assert len({goal.scene_of(t) for t in suite_tasks("libero_goal")}) == 1
    assert len({objects.scene_of(t) for t in suite_tasks(SUITE)}) == len(suite_tasks(SUITE))
    stove, drawer = "turn_on_the_stove", "open_the_middle_drawer_of_the_cabinet"
    render = {"cameras": ["agentview", "eye_in_hand"], "image_size": 32, "quality": "low"}
    chunk = np.tile(np.array([0.3, 0.0, -0.2, 0, 0, 0, -1], dtype=np.float32), (4, 1))

    def light_the_stove(task):
        model, data = task.sim.model, task.sim.data
        data.qpos[model.jnt_qposadr[model.joint_name2id("flat_stove_1_button")]] = 1.0
        task.sim.forward()
        return task.env.check_success()

    def episode(env, task, seed):
        start = env.begin(EpisodeSpec(task, seed, 0))[0]
        return start, env.advance_chunk(chunk, 1, False)[0][-1][1]

    switched, fresh = (TaskEnv("libero_goal", render, 300, None, task_limit=1) for _ in range(2))
    try:
        episode(switched, stove, 10**9 + 2)
        built = switched.current
        assert light_the_stove(built)  # the stove task's goal, its burner now drawn lit
        switched.current.step(np.zeros(7))
        got, want = episode(switched, drawer, 10**9 + 4), episode(fresh, drawer, 10**9 + 4)
        assert switched.current is built and len(switched.tasks) == 1  # switched, not built again
        for a, b in zip(got, want, strict=True):
            for key in b:
                np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        assert (built.instruction, built.objects_of_interest) == (fresh.current.instruction,
                                                                   fresh.current.objects_of_interest)
        assert not light_the_stove(built)  # the drawer's goal now
        episode(switched, stove, 10**9 + 2)
        assert switched.current is built and light_the_stove(built)
    finally:
        switched.close()
        fresh.close()


def test_a_scene_loaded_from_the_compiled_scenes_runs_as_a_compiled_one(tmp_path, caplog, monkeypatch, request):
    """Env slots sharing a folder of compiled scenes: the first build compiles and saves its scene (a build
    that starts while another worker compiles it compiles too, without saving), the next loads it, and all run as a
    build that compiled it (bit for bit); a damaged file is compiled again and replaced, a folder that cannot be
    written only stops the saving, and robosuite compiles as before outside."""
    from robosuite.utils.binding_utils import MjSim

    from ript.envs.compiled_scenes import CompiledScenes
    from ript.envs.worker_env import EpisodeSpec, TaskEnv

    render = {"cameras": ["agentview", "eye_in_hand"], "image_size": 32, "quality": "low"}
    chunk = np.tile(np.array([0.3, 0.0, -0.2, 0, 0, 0, -1], dtype=np.float32), (4, 1))
    original = MjSim.__dict__["from_xml_string"]

    def episode(compiled):
        env = TaskEnv(SUITE, render, 300, None, 1, compiled)
        try:
            start = env.begin(EpisodeSpec(TASK, 10**9 + 3, 0))[0]
            return [start, *(obs for _, obs in env.advance_chunk(chunk, 4, False)[0])]
        finally:
            env.close()

    def assert_same(got, want):
        for a, b in zip(got, want, strict=True):
            for key in b:
                np.testing.assert_array_equal(a[key], b[key], err_msg=key)

    # the warnings go to ript's logger, which a CLI run earlier in this process may have stopped propagating
    logging.getLogger("ript").addHandler(caplog.handler)
    request.addfinalizer(lambda: logging.getLogger("ript").removeHandler(caplog.handler))
    compiled = CompiledScenes(tmp_path / "scenes")
    (tmp_path / "scenes").mkdir()
    want = episode(None)
    assert_same(episode(compiled), want)  # compiled, then saved
    saved = sorted((tmp_path / "scenes").iterdir())
    assert [p.suffix for p in saved] == [".claimed", ".mjb"]
    claim, saved = saved[0], saved[1:]
    busy = tmp_path / "busy"  # another worker has claimed the scene and is compiling it: this one compiles too
    busy.mkdir()
    (busy / claim.name).touch()
    assert_same(episode(CompiledScenes(busy)), want)
    assert [p.name for p in busy.iterdir()] == [claim.name]  # and leaves the saving to it
    stamp = saved[0].stat().st_mtime_ns
    assert_same(episode(compiled), want)  # loaded
    assert saved[0].stat().st_mtime_ns == stamp  # read, not written again
    saved[0].write_bytes(saved[0].read_bytes()[:1000])  # a damaged file
    monkeypatch.chdir(tmp_path)  # where MuJoCo logs its warning about it (MUJOCO_LOG.TXT)
    assert_same(episode(compiled), want)
    assert "could not be read" in caplog.text and saved[0].stat().st_size > 1000  # compiled and replaced
    unwritable = CompiledScenes(saved[0])  # a file where the folder should be
    assert_same(episode(unwritable), want)
    assert unwritable.write_failed and "are not kept" in caplog.text
    assert MjSim.__dict__["from_xml_string"] is original
    compiled.remove()
    assert not (tmp_path / "scenes").exists()


def test_a_task_of_another_scene_is_refused_and_leaves_the_task_as_it_was(soup_task):
    from ript.envs.libero import suite_tasks

    other = suite_tasks(SUITE)[1]
    with pytest.raises(RiptError, match=f"libero_object task '{other}' is not in the scene of '{TASK}'"):
        soup_task.switch_to(other)
    assert soup_task.task_name == TASK and soup_task.objects_of_interest == ["alphabet_soup_1", "basket_1"]


def test_unknown_libero_names_are_one_line_errors():
    from ript.envs.libero import LiberoTask, check_task_names

    with pytest.raises(RiptError, match="unknown libero_object task 'no_such_task'"):
        check_task_names(SUITE, ["no_such_task"])
    with pytest.raises(RiptError, match="unknown LIBERO suite 'libero_100'"):
        LiberoTask("libero_100", TASK, None)


def write_official_file(path: Path, n_demos: int = 2, steps: int = 12, size: int = 16) -> None:
    """A small file in exactly the layout of LIBERO's create_dataset.py (random contents)."""
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["problem_info"] = json.dumps({
            "problem_name": "LIBERO_Floor_Manipulation", "domain_name": "robosuite",
            "language_instruction": "pick up the alphabet soup and place it in the basket"})
        data.attrs["bddl_file_name"] = "libero/libero/bddl_files/libero_object/soup.bddl"
        data.attrs["env_args"] = json.dumps({"type": 1, "env_name": "LIBERO_Floor_Manipulation",
                                             "env_kwargs": {"camera_heights": size, "camera_widths": size}})
        data.attrs["tag"] = "libero-v1"
        data.attrs["num_demos"] = n_demos
        data.attrs["total"] = n_demos * steps
        for i in range(n_demos):
            g = data.create_group(f"demo_{i}")
            g.create_dataset("actions", data=rng.uniform(-1, 1, (steps, 7)))
            g.create_dataset("states", data=rng.normal(size=(steps, 110)))
            g.create_dataset("robot_states", data=rng.normal(size=(steps, 9)))
            g.create_dataset("rewards", data=np.r_[np.zeros(steps - 1), 1].astype(np.uint8))
            g.create_dataset("dones", data=np.r_[np.zeros(steps - 1), 1].astype(np.uint8))
            img = rng.integers(0, 255, (steps, size, size, 3), dtype=np.uint8)
            img[:, 0] = 255  # the first stored row (the bottom of the upright image) is marked
            g.create_dataset("obs/agentview_rgb", data=img)
            g.create_dataset("obs/eye_in_hand_rgb", data=img)
            for key, dim in (("joint_states", 7), ("gripper_states", 2), ("ee_states", 6), ("ee_pos", 3),
                             ("ee_ori", 3)):
                g.create_dataset(f"obs/{key}", data=rng.normal(size=(steps, dim)))
            g.attrs["num_samples"] = steps


def test_official_layout_reads_through_the_task_config(tmp_path):
    from ript.config import data_files
    from ript.data.dataset import ChunkDataset, DatasetSpec

    write_official_file(tmp_path / f"{TASK}_demo.hdf5")
    cfg = compose("stage1", ["task=libero_object", f"task.data_dir={tmp_path}", f"task.task_names=[{TASK}]"])
    files = data_files(cfg.task)
    ds = ChunkDataset(DatasetSpec(files, dict(cfg.task.obs_keys), 8, action_dim=7, val_fraction=0.0,
                                  flip_keys=tuple(cfg.task.flip_obs_keys)), "all")
    assert ds.num_demos == 2 and len(ds) == 24
    assert ds.instructions == ["pick up the alphabet soup and place it in the basket"]
    assert (ds.obs["agentview_rgb"][:, -1] == 255).all()  # flipped upright on reading
    assert ds.obs["joint_states"].shape == (24, 7)
    meta = ds.metadata(cfg.task)
    assert meta["suite"] == SUITE and meta["env_args"]["render"]["cameras"] == ["agentview", "eye_in_hand"]
    # a missing key names the file and the key
    with h5py.File(files[0], "a") as f:
        del f["data/demo_1/obs/gripper_states"]
    with pytest.raises(RiptError, match=r"_demo\.hdf5:data/demo_1/obs/gripper_states is missing"):
        ChunkDataset(DatasetSpec(files, dict(cfg.task.obs_keys), 8), "all")


@pytest.fixture(scope="module")
def libero_demos(tmp_path_factory) -> Path:
    from ript.stages import collect

    data_dir = tmp_path_factory.mktemp("libero_data")
    collect.run(compose("collect", ["task=libero_object_test", f"task.data_dir={data_dir}", "task.demos_per_task=1",
                                    "task.render.image_size=32", "num_workers=1"]))
    return data_dir


def test_scripted_expert_collects_a_successful_episode_in_the_official_layout(libero_demos):
    path = libero_demos / f"{TASK}_demo.hdf5"
    with h5py.File(path, "r") as f:
        data = f["data"]
        assert json.loads(data.attrs["problem_info"])["language_instruction"].startswith("pick up the alphabet soup")
        assert json.loads(data.attrs["env_args"])["env_kwargs"]["controller"] == "OSC_POSE"
        g = data["demo_0"]
        assert bool(g.attrs["success"])
        n = len(g["actions"])
        assert 60 < n < 280 and g["rewards"][-1] == 1 and g["dones"][-1] == 1
        assert g["states"].shape[0] == n and g["robot_states"].shape == (n, 9)
        assert g["obs/agentview_rgb"].shape == (n, 32, 32, 3) and g["obs/ee_pos"].shape == (n, 3)
        assert 0.3 < float(np.mean(np.abs(g["actions"][:, :3]))) < 1.0  # the arm really moved


def test_lerobot_export_and_import_of_libero_demos(libero_demos, tmp_path):
    """A LIBERO file in the official layout (its name, robot_states, the problem_info attribute) survives the
    LeRobot v3.0 round trip: every array exact but the frames (AV1: mean error a few levels of 255)."""
    pytest.importorskip("pyarrow", reason="the lerobot extra: pip install -e .[lerobot]")
    from ript.stages.lerobot_io import run_export, run_import

    task = ["task=libero_object_test", f"task.data_dir={libero_demos}", "task.render.image_size=32"]
    info = run_export(compose("export", task + [f"out={tmp_path / 'lerobot'}"]))
    assert info["fps"] == 20 and info["total_tasks"] == 1 and "observation.images.agentview_rgb" in info["features"]
    (path,) = run_import(compose("import", [f"src={tmp_path / 'lerobot'}", f"data_dir={tmp_path / 'back'}"]))
    assert path.name == f"{TASK}_demo.hdf5"
    assert_round_trip(libero_demos / path.name, path, mean_image_error=8.0)


def test_pipeline_and_rl_iteration_on_libero(libero_demos, tmp_path):
    from ript.stages import rl, stage0, stage1

    task = ["task=libero_object_test", f"task.data_dir={libero_demos}", "task.render.image_size=32",
            "algo=quest_small", "progress=false"]
    train = ["train.batch_size=8", "train.warmup_steps=1", "train.val_every=2", "data.val_fraction=0"]
    stage0.run(compose("stage0", task + train + [f"run_dir={tmp_path / 's0'}", "train.steps=2"]))
    stage1.run(compose("stage1", task + train + [f"run_dir={tmp_path / 's1'}", f"stage0_checkpoint={tmp_path / 's0'}",
                                                 "train.steps=2"]))
    rl.run(compose("rl", [f"checkpoint={tmp_path / 's1'}", f"run_dir={tmp_path / 'rl'}", "rl.iterations=1",
                          "rl.groups_per_iteration=1", "rl.rollouts_per_group=2", "rl.max_episode_steps=16",
                          "rl.num_workers=1", "rl.max_sampling_rounds=1", "eval.every=0"]))
    ckpt = json.loads((tmp_path / "rl" / "checkpoints" / "last" / "config.json").read_text())
    assert ckpt["metadata"]["suite"] == SUITE and ckpt["step"] == 1


def test_demo_resets_never_start_with_a_falling_object():
    """LIBERO's sampler drops the bowl "on the stove" off the table: such resets fall back to a shifted
    packaged state, which differs from every evaluation state and stays put."""
    from ript.envs.libero import LiberoTask

    name = "pick_up_the_black_bowl_on_the_stove_and_place_it_on_the_plate"
    task = LiberoTask("libero_spatial", name, None)
    try:
        task.reset(0, render=False)
        bowl = task.privileged()["akita_black_bowl_1_pos"].copy()
        for _ in range(10):
            task.step(np.zeros(7), render=False)
        assert bowl[2] > 0.85 and abs(task.privileged()["akita_black_bowl_1_pos"][2] - bowl[2]) < 0.01
        task.reset(10**9, render=False)
        packaged = task.privileged()["akita_black_bowl_1_pos"]
        assert 1e-3 < np.abs(packaged[:2] - bowl[:2]).max() < 0.05
    finally:
        task.close()


def test_collection_workers_open_their_tasks_through_the_compiled_scenes(tmp_path):
    """``ript collect`` gives its workers one folder of compiled scenes: the first to open a scene saves it
    there, and a worker opening the scene again loads it (a scene so loaded runs as a compiled one: above)."""
    from ript.envs.compiled_scenes import CompiledScenes
    from ript.experts.collect import Job, _run_jobs

    render = {"cameras": ["agentview"], "image_size": 32, "quality": "low"}
    compiled = CompiledScenes(tmp_path / "scenes")
    (tmp_path / "scenes").mkdir()
    job = Job(SUITE, TASK, 0, 0, 0, 0.0, True, 1, render, 300, str(tmp_path / "shard.hdf5"))  # opens, runs none
    [done] = _run_jobs([job], compiled)
    assert done["task"] == TASK and done["demos"] == 0
    assert len(list((tmp_path / "scenes").glob("*.mjb"))) == 1
