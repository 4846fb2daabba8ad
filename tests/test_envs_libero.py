"""LIBERO on the real simulator: a task builds, resets from a packaged init state and steps; a file in the
official dataset layout trains through the same reader; the scripted expert collects a successful episode;
a tiny pipeline (stage 0, stage 1, one RL iteration) runs on those demonstrations."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import drive_scripted_demo, scripted_libero_episode
from ript.config import compose
from ript.errors import RiptError

SUITE = "libero_object"
TASK = "pick_up_the_alphabet_soup_and_place_it_in_the_basket"


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
        data.attrs["problem_info"] = json.dumps({"problem_name": "LIBERO_Floor_Manipulation", "domain_name": "robosuite",
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
            for key, dim in (("joint_states", 7), ("gripper_states", 2), ("ee_states", 6), ("ee_pos", 3), ("ee_ori", 3)):
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
    from conftest import assert_round_trip
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


def test_expert_places_on_a_table_region():
    """(On chocolate_pudding_1 living_room_table_plate_right_region): the target is a region of the table, a
    site with no object under it; the expert releases over the site and the environment reports success."""
    from ript.data.collect_libero import run_episode
    from ript.data.libero_goals import make_expert
    from ript.envs.libero import LiberoTask

    name = "LIVING_ROOM_SCENE6_put_the_white_mug_on_the_plate_and_put_the_chocolate_pudding_to_the_right_of_the_plate"
    task = LiberoTask("libero_10", name, None)
    try:
        task.reset(0, render=False)
        second = make_expert(task).steps[1]
        assert (second.obj, second.target, second.target_site) == (
            "chocolate_pudding_1", None, "living_room_table_plate_right_region")
        # the expert succeeds 10 times in 10 in benchmarks/libero_experts; these seeds are one more success
        demo = run_episode(task, 100, np.random.default_rng(1), 0.05, render=False)
        assert demo.attrs["success"] and len(demo.actions) < 520
    finally:
        task.close()


def test_a_book_turns_to_fit_the_caddys_front_compartment():
    """(In black_book_1 desk_caddy_1_front_contain_region): the compartment is narrower (7.2 cm) than the book
    is wide (~11.6 cm), so the carried book turns its narrow side across it and drops in (0/15 before)."""
    from ript.data.collect_libero import run_episode
    from ript.data.libero_goals import make_expert
    from ript.envs.libero import LiberoTask

    task = LiberoTask("libero_90", "STUDY_SCENE1_pick_up_the_book_and_place_it_in_the_front_compartment_of_the_caddy",
                      None)
    try:
        demo = run_episode(task, 3, np.random.default_rng(2), 0.05, render=False)
        expert = make_expert(task)  # the goal it was given: the compartment, a box site of the caddy
        assert demo.attrs["success"] and len(demo.actions) < 200
        assert expert.target_site == "desk_caddy_1_front_contain_region"
    finally:
        task.close()


def test_a_moka_pot_is_carried_by_its_handle_onto_the_stove():
    """The moka pot is wider than the hand opens and has a lid (no rim to pinch): the expert grips its handle,
    the geoms farthest from its centre of mass (1/10 before, 5/5 after in benchmarks/libero_experts)."""
    from ript.data.collect_libero import run_episode
    from ript.data.libero_goals import make_expert
    from ript.envs.libero import LiberoTask

    task = LiberoTask("libero_90", "KITCHEN_SCENE3_put_the_moka_pot_on_the_stove", None)
    try:
        task.reset(0, render=False)
        assert make_expert(task).by_handle
        demo = run_episode(task, 5, np.random.default_rng(3), 0.05, render=False)
        assert demo.attrs["success"] and len(demo.actions) < 250
    finally:
        task.close()


def test_two_objects_bound_for_one_region_go_side_by_side():
    """(On moka_pot_1 flat_stove_1_cook_region) (On moka_pot_2 flat_stove_1_cook_region): the second pot used to be
    released on top of the first; now each gets its own spot along the region (0/5 before, 5/5 after)."""
    from ript.data.collect_libero import run_episode
    from ript.data.libero_experts import PickPlaceExpert
    from ript.data.libero_goals import make_expert
    from ript.envs.libero import LiberoTask

    task = LiberoTask("libero_10", "KITCHEN_SCENE8_put_both_moka_pots_on_the_stove", None)
    try:
        task.reset(0, render=False)
        first, second = [s for s in make_expert(task).steps if isinstance(s, PickPlaceExpert)]
        assert np.linalg.norm(first.offset - second.offset) > 0.08  # a moka pot is ~8 cm across its body
        demo = run_episode(task, 7, np.random.default_rng(4), 0.05, render=False)
        assert demo.attrs["success"]
    finally:
        task.close()


def test_a_book_is_squared_up_and_centred_between_a_square_compartments_walls():
    """(In black_book_1 desk_caddy_1_right_contain_region): the compartment (12.6 x 12.9 cm inside) is barely wider
    than the book is long (11.4 cm) and its site sits 6 mm off the walls' centre: the book, picked turned 20
    degrees, is squared up with the compartment and put where its outline has most room (1/9 before, 30/30 over the three
    scenes' right compartments in benchmarks/libero_experts)."""
    from ript.data.collect_libero import run_episode
    from ript.envs.libero import LiberoTask

    task = LiberoTask("libero_90", "STUDY_SCENE2_pick_up_the_book_and_place_it_in_the_right_compartment_of_the_caddy",
                      None)
    try:
        demo = run_episode(task, 0, np.random.default_rng(0), 0.05, render=False)
        assert demo.attrs["success"] and len(demo.actions) < 150
    finally:
        task.close()


def test_a_frying_pan_handle_is_gripped_turned_away_from_the_moka_pot_beside_it():
    """KITCHEN_SCENE3's pan handle lies 4-6 cm from a moka pot: gripped square across the handle, the hand (wide
    along the fingers) came down on the pot and stalled over the handle until the horizon (demo 15; the task 8/20).
    The grip now turns off square to keep the hand clear of taller neighbours, as for a carton."""
    from ript.data.libero_geometry import handle_grasp, wrap_half_turn

    def turned(task, expert, step):
        if step == 1:  # the grasp planned by the first step
            _, _, square = handle_grasp(task.sim, f"{expert.obj}_main")
            assert abs(wrap_half_turn(expert.grasp_yaw - square)) > np.deg2rad(5)

    success, steps = drive_scripted_demo("libero_90", "KITCHEN_SCENE3_put_the_frying_pan_on_the_stove", 15, 200, turned)
    assert success, steps


def test_a_drawer_open_over_the_object_is_pushed_back_part_way_then_filled_and_closed():
    """KITCHEN_SCENE10's top drawer starts 14.8 cm out, 15 cm over the table, its handle 5-7 cm from the pudding's
    side: the hand, wide across the pudding's narrow side, stalled on it until the horizon (3/20). The drawer is
    pushed in only as far as the hand needs (stopping there: pushed at full speed it coasted 2.5 cm on), and the
    region's size is read along its level axes (its local x is vertical: read as its width, the pudding was turned
    long side into the shallower drawer and left half on the cabinet). Demo 1 failed for want of either."""
    from ript.data.libero_articulated import JointPushExpert
    from ript.data.libero_joints import Articulation, joint_for

    def pushed_back(task, expert, step):
        cabinet, joint = joint_for(task, "wooden_cabinet_1_top_region")
        drawer, push = Articulation(task, joint), expert.steps[0]
        if step == 0:
            assert isinstance(push, JointPushExpert) and push.stop_at is not None
            assert cabinet.is_open(drawer.qpos) and not cabinet.is_open(push.stop_at)
        if expert.index == 1 and expert.steps[1].phase == "align":
            assert abs(drawer.qpos - push.stop_at) < 0.01 and not cabinet.is_close(drawer.qpos)

    name = "KITCHEN_SCENE10_put_the_chocolate_pudding_in_the_top_drawer_of_the_cabinet_and_close_it"
    success, steps = drive_scripted_demo("libero_90", name, 1, 300, pushed_back)
    assert success, steps


def test_a_quarter_turn_goes_the_way_round_that_keeps_the_wrist_off_its_stop():
    """KITCHEN_SCENE9's pan handle points along y and the hand starts with its fingers across x: a quarter turn,
    either way. The way the shorter-by-a-hair turn took drove the wrist's last joint to its stop, the hand wandered
    while lining up, and the pan slipped from grasp after grasp (demo 7 to the horizon). Now such a turn goes the
    other way round (the task's demos 0-7: 5/8 -> 7/8)."""
    import mujoco

    from ript.data.libero_geometry import WRIST_JOINT, WRIST_MARGIN

    def off_the_stop(task, expert, step):
        model, data = task.sim.model._model, task.sim.data._data
        wrist = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, WRIST_JOINT)
        lo, hi = model.jnt_range[wrist]
        assert lo + WRIST_MARGIN / 2 < data.qpos[model.jnt_qposadr[wrist]] < hi - WRIST_MARGIN / 2, step

    success, steps = drive_scripted_demo("libero_90", "KITCHEN_SCENE9_put_the_frying_pan_on_top_of_the_cabinet", 7, 200,
                                         off_the_stop)
    assert success, steps


@pytest.mark.parametrize("demo", [3, 6])
def test_a_pan_is_gripped_far_enough_off_square_and_held_while_its_weight_tilts_it(demo):
    """KITCHEN_SCENE3 again. Demo 3: within 30 degrees of square the hand keeps 3 mm from the moka pot and stalled
    on it for 300 steps; a handle may be gripped 60 degrees off square. Demo 6: lifted by its handle, the pan tilts
    10 degrees in the fingers and its far rim drops 4 cm, which read as a slip: let go and grasped again and again
    (278 steps); a slip of a handled object is read at its handle."""
    phases = []
    success, steps = drive_scripted_demo("libero_90", "KITCHEN_SCENE3_put_the_frying_pan_on_the_stove", demo, 160,
                                         lambda task, expert, step: phases.append(expert.phase))
    assert success, steps
    assert "align" not in phases[phases.index("lift"):]  # never let go of the pan once lifted


@pytest.mark.parametrize("book", ["in_the_middle", "on_the_right"])
def test_a_book_too_tall_for_the_shelf_layer_goes_in_on_its_edge(book):
    """STUDY_SCENE4: the black book stands 13.4 cm under a 13.5 cm board, the yellow one 12.2 cm: held from above,
    neither went in (0/20). Turned in the hand until the fingers point into the layer, each slides in on its long
    edge; the yellow book's way in is angled (straight in, the wrist came down on the black book standing in line
    with the shelf's middle: 0/8)."""
    from ript.data.libero_turned_slide_in import TurnedSlideInExpert

    expert, demo = scripted_libero_episode("libero_90", f"STUDY_SCENE4_pick_up_the_book_{book}_and_place_it_on_the_"
                                           "cabinet_shelf", demo=0)
    assert isinstance(expert, TurnedSlideInExpert)
    assert demo.attrs["success"] and len(demo.actions) < 200


def test_a_book_too_tall_to_stand_under_the_shelf_board_is_tipped_over_and_pushed_in():
    """STUDY_SCENE4: under the shelf's middle board there are 6.9 cm, the yellow book is 12.2 cm tall and 9.8 cm
    wide, and no grasp holds it flat with the hand above the table: it is tipped over towards the shelf, then
    pushed in along the table with the hand leaning into the push until LIBERO's test of the region holds (0/20
    before). The layer's open side is found with the study's table left out of the walls (it is "study_table":
    taken for a wall, it hid the open side and the book was tipped away from the shelf)."""
    from ript.data.libero_articulated import JointPushExpert
    from ript.data.libero_tilted_push import LeaningPushExpert

    expert, demo = scripted_libero_episode("libero_90", "STUDY_SCENE4_pick_up_the_book_on_the_right_and_place_it_"
                                           "under_the_cabinet_shelf", demo=0)
    tip, push_in = expert.steps
    assert isinstance(tip, JointPushExpert) and isinstance(push_in, LeaningPushExpert)
    assert tip.art.push[1] > 0.9  # towards the shelf, whose open side faces -y
    assert demo.attrs["success"] and len(demo.actions) < 200


def test_a_pan_tilted_in_the_fingers_slides_in_over_the_board_front():
    """KITCHEN_SCENE9's pan onto the cabinet shelf, demo 7: held by its handle the pan tilts 10 degrees and its far
    rim hung 3-4 cm lower than when grasped, caught on the board's front and stalled there (once a tilt no longer
    reads as a slip); it slides in with its lowest point, as it hangs now, over the floor."""
    _, demo = scripted_libero_episode("libero_90", "KITCHEN_SCENE9_put_the_frying_pan_on_the_cabinet_shelf", demo=7)
    assert demo.attrs["success"] and len(demo.actions) < 150


def test_a_frying_pan_slides_under_a_shelf_board_held_by_its_handle():
    """(In chefmate_8_frypan_1 wooden_two_layer_shelf_1_bottom_region): 6.9 cm under the shelf's middle board, where
    a hand cannot come down from above (carried over it, the pan landed on the shelf's top: 0/5). The pan goes in flat
    through the shelf's open side, body first, the hand outside on the end of its handle."""
    from ript.data.libero_slide_in import SlideInExpert

    expert, demo = scripted_libero_episode("libero_90", "KITCHEN_SCENE9_put_the_frying_pan_under_the_cabinet_shelf")
    assert isinstance(expert, SlideInExpert)
    assert demo.attrs["success"] and len(demo.actions) < 200


def test_a_mug_goes_into_the_microwave_by_its_handle_and_is_pushed_in_before_the_door_closes():
    """(In white_yellow_mug_1 microwave_1_heating_region) then (Close microwave_1): the microwave is 14.4 cm high
    inside, too low for a hand above the 10.3 cm mug (lowered from above, it stood on the microwave's top: 0/5). Slid
    in by its handle, the hand stays out in front of the microwave's top, the handle still sticks out of the door;
    a hand leaning into the push shoves it in past the front, and the door closes."""
    from ript.data.libero_slide_in import SlideInExpert
    from ript.data.libero_tilted_push import LeaningPushExpert

    expert, demo = scripted_libero_episode(
        "libero_10", "KITCHEN_SCENE6_put_the_yellow_and_white_mug_in_the_microwave_and_close_it")
    assert [type(step) for step in expert.steps][:2] == [SlideInExpert, LeaningPushExpert]
    assert demo.attrs["success"] and len(demo.actions) < 450


@pytest.mark.parametrize("name", ["KITCHEN_SCENE2_put_the_black_bowl_at_the_front_on_the_plate",
                                  "LIVING_ROOM_SCENE5_put_the_yellow_and_white_mug_on_the_right_plate"])
def test_a_placed_object_is_let_go_with_its_origin_over_the_targets(name):
    """LIBERO's (On X plate) holds within 3 cm of the plate's origin. The bowl was let go where the carry's momentum
    had taken it, 2.7 cm past the plate's centre, and the mug's outline (its handle with it) was centred over the
    plate, its origin 3 cm off: both failed this demo (libero_90 at 5 demos: 3/5 each). Now the object's origin is
    put over the target's and let go only once within PLACE_ALIGN of it."""
    from ript.data.libero_experts import PickPlaceExpert

    expert, demo = scripted_libero_episode("libero_90", name, demo=0)
    assert isinstance(expert, PickPlaceExpert)
    assert demo.attrs["success"]


def test_a_bowl_under_a_drawer_is_set_aside_and_still_goes_in_within_libero_goals_300_steps():
    """libero_goal's (Open top drawer) and (In bowl top drawer): the open drawer would hang over the bowl, so the bowl
    is set aside first; setting it aside, opening the drawer and putting it in took 313-321 steps, over the suite's 300
    (the set-aside was off there: 1/5). Only in such a sequence, the picks come down fast, the drawer's hand lines up
    while it turns and turns back early, and the bowl is carried 5 cm over the drawer, not 10: demo 1 took 283 steps
    with the first two (session 27), 276 with all four, leaving room for the layouts that need more."""
    from ript.data.libero_articulated import SlideOpenExpert
    from ript.data.libero_set_aside import SetAsideExpert

    expert, demo = scripted_libero_episode("libero_goal", "open_the_top_drawer_and_put_the_bowl_inside", demo=1)
    assert isinstance(expert.steps[0], SetAsideExpert) and expert.steps[0].fast_descent
    assert isinstance(expert.steps[1], SlideOpenExpert) and expert.steps[1].hurried
    assert demo.attrs["success"] and len(demo.actions) <= 280
