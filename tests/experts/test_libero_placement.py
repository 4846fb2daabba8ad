"""LIBERO's pick-and-place experts on the real simulator, one hard placement each: a table region, a caddy's
compartment, a handled pot or pan, two objects for one region, a drawer open over its object, a turn kept off the
wrist's stop, books onto and under a shelf board, a mug into the microwave — each traced with the collection's
seeds and checked for LIBERO's own success."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.libero import drive_scripted_demo, scripted_libero_episode


@pytest.mark.extended
def test_expert_places_on_a_table_region():
    """(On chocolate_pudding_1 living_room_table_plate_right_region): the target is a region of the table, a
    site with no object under it; the expert releases over the site and the environment reports success."""
    from ript.envs.libero import LiberoTask
    from ript.experts.libero.episode import run_episode
    from ript.experts.libero.goals import make_expert

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


@pytest.mark.extended
def test_a_book_turns_to_fit_the_caddys_front_compartment():
    """(In black_book_1 desk_caddy_1_front_contain_region): the compartment is narrower (7.2 cm) than the book
    is wide (~11.6 cm), so the carried book turns its narrow side across it and drops in (0/15 before)."""
    from ript.envs.libero import LiberoTask
    from ript.experts.libero.episode import run_episode
    from ript.experts.libero.goals import make_expert

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
    from ript.envs.libero import LiberoTask
    from ript.experts.libero.episode import run_episode
    from ript.experts.libero.goals import make_expert

    task = LiberoTask("libero_90", "KITCHEN_SCENE3_put_the_moka_pot_on_the_stove", None)
    try:
        task.reset(0, render=False)
        assert make_expert(task).by_handle
        demo = run_episode(task, 5, np.random.default_rng(3), 0.05, render=False)
        assert demo.attrs["success"] and len(demo.actions) < 250
    finally:
        task.close()


@pytest.mark.extended
def test_two_objects_bound_for_one_region_go_side_by_side():
    """(On moka_pot_1 flat_stove_1_cook_region) (On moka_pot_2 flat_stove_1_cook_region): the second pot used to be
    released on top of the first; now each gets its own spot along the region (0/5 before, 5/5 after)."""
    from ript.envs.libero import LiberoTask
    from ript.experts.libero.episode import run_episode
    from ript.experts.libero.goals import make_expert
    from ript.experts.libero.pick_place import PickPlaceExpert

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
    degrees, is squared up with the compartment and put where its outline has most room (1/9 before, 30/30 over
    the three scenes' right compartments in benchmarks/libero_experts)."""
    from ript.envs.libero import LiberoTask
    from ript.experts.libero.episode import run_episode

    task = LiberoTask("libero_90", "STUDY_SCENE2_pick_up_the_book_and_place_it_in_the_right_compartment_of_the_caddy",
                      None)
    try:
        demo = run_episode(task, 0, np.random.default_rng(0), 0.05, render=False)
        assert demo.attrs["success"] and len(demo.actions) < 150
    finally:
        task.close()


@pytest.mark.extended
def test_a_frying_pan_handle_is_gripped_turned_away_from_the_moka_pot_beside_it():
    """KITCHEN_SCENE3's pan handle lies 4-6 cm from a moka pot: gripped square across the handle, the hand (wide
    along the fingers) came down on the pot and stalled over the handle until the horizon (demo 15; the task 8/20).
    The grip now turns off square to keep the hand clear of taller neighbours, as for a carton."""
    from ript.experts.libero.geometry import handle_grasp, wrap_half_turn

    def turned(task, expert, step):
        if step == 1:  # the grasp planned by the first step
            _, _, square = handle_grasp(task.sim, f"{expert.obj}_main")
            assert abs(wrap_half_turn(expert.grasp_yaw - square)) > np.deg2rad(5)

    success, steps = drive_scripted_demo("libero_90", "KITCHEN_SCENE3_put_the_frying_pan_on_the_stove", 15, 200, turned)
    assert success, steps


@pytest.mark.extended
def test_a_drawer_open_over_the_object_is_pushed_back_part_way_then_filled_and_closed():
    """KITCHEN_SCENE10's top drawer starts 14.8 cm out, 15 cm over the table, its handle 5-7 cm from the pudding's
    side: the hand, wide across the pudding's narrow side, stalled on it until the horizon (3/20). The drawer is
    pushed in only as far as the hand needs (stopping there: pushed at full speed it coasted 2.5 cm on), and the
    region's size is read along its level axes (its local x is vertical: read as its width, the pudding was turned
    long side into the shallower drawer and left half on the cabinet). Demo 1 failed for want of either."""
    from ript.experts.libero.joints import Articulation, joint_for
    from ript.experts.libero.push import JointPushExpert

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


@pytest.mark.extended
def test_a_quarter_turn_goes_the_way_round_that_keeps_the_wrist_off_its_stop():
    """KITCHEN_SCENE9's pan handle points along y and the hand starts with its fingers across x: a quarter turn,
    either way. The way the shorter-by-a-hair turn took drove the wrist's last joint to its stop, the hand wandered
    while lining up, and the pan slipped from grasp after grasp (demo 7 to the horizon). Now such a turn goes the
    other way round (the task's demos 0-7: 5/8 -> 7/8)."""
    import mujoco

    from ript.experts.libero.geometry import WRIST_JOINT, WRIST_MARGIN

    def off_the_stop(task, expert, step):
        model, data = task.sim.model._model, task.sim.data._data
        wrist = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, WRIST_JOINT)
        lo, hi = model.jnt_range[wrist]
        assert lo + WRIST_MARGIN / 2 < data.qpos[model.jnt_qposadr[wrist]] < hi - WRIST_MARGIN / 2, step

    success, steps = drive_scripted_demo("libero_90", "KITCHEN_SCENE9_put_the_frying_pan_on_top_of_the_cabinet", 7, 200,
                                         off_the_stop)
    assert success, steps


@pytest.mark.extended
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


@pytest.mark.extended
@pytest.mark.parametrize("book", ["in_the_middle", "on_the_right"])
def test_a_book_too_tall_for_the_shelf_layer_goes_in_on_its_edge(book):
    """STUDY_SCENE4: the black book stands 13.4 cm under a 13.5 cm board, the yellow one 12.2 cm: held from above,
    neither went in (0/20). Turned in the hand until the fingers point into the layer, each slides in on its long
    edge; the yellow book's way in is angled (straight in, the wrist came down on the black book standing in line
    with the shelf's middle: 0/8)."""
    from ript.experts.libero.turned_slide_in import TurnedSlideInExpert

    expert, demo = scripted_libero_episode("libero_90", f"STUDY_SCENE4_pick_up_the_book_{book}_and_place_it_on_the_"
                                           "cabinet_shelf", demo=0)
    assert isinstance(expert, TurnedSlideInExpert)
    assert demo.attrs["success"] and len(demo.actions) < 200


@pytest.mark.extended
def test_a_book_too_tall_to_stand_under_the_shelf_board_is_tipped_over_and_pushed_in():
    """STUDY_SCENE4: under the shelf's middle board there are 6.9 cm, the yellow book is 12.2 cm tall and 9.8 cm
    wide, and no grasp holds it flat with the hand above the table: it is tipped over towards the shelf, then
    pushed in along the table with the hand leaning into the push until LIBERO's test of the region holds (0/20
    before). The layer's open side is found with the study's table left out of the walls (it is "study_table":
    taken for a wall, it hid the open side and the book was tipped away from the shelf)."""
    from ript.experts.libero.leaning import LeaningPushExpert
    from ript.experts.libero.push import JointPushExpert

    expert, demo = scripted_libero_episode("libero_90", "STUDY_SCENE4_pick_up_the_book_on_the_right_and_place_it_"
                                           "under_the_cabinet_shelf", demo=0)
    tip, push_in = expert.steps
    assert isinstance(tip, JointPushExpert) and isinstance(push_in, LeaningPushExpert)
    assert tip.art.push[1] > 0.9  # towards the shelf, whose open side faces -y
    assert demo.attrs["success"] and len(demo.actions) < 200


@pytest.mark.extended
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
    from ript.experts.libero.slide_in import SlideInExpert

    expert, demo = scripted_libero_episode("libero_90", "KITCHEN_SCENE9_put_the_frying_pan_under_the_cabinet_shelf")
    assert isinstance(expert, SlideInExpert)
    assert demo.attrs["success"] and len(demo.actions) < 200


@pytest.mark.extended
def test_a_mug_goes_into_the_microwave_by_its_handle_and_is_pushed_in_before_the_door_closes():
    """(In white_yellow_mug_1 microwave_1_heating_region) then (Close microwave_1): the microwave is 14.4 cm high
    inside, too low for a hand above the 10.3 cm mug (lowered from above, it stood on the microwave's top: 0/5). Slid
    in by its handle, the hand stays out in front of the microwave's top, the handle still sticks out of the door;
    a hand leaning into the push shoves it in past the front, and the door closes."""
    from ript.experts.libero.leaning import LeaningPushExpert
    from ript.experts.libero.slide_in import SlideInExpert

    expert, demo = scripted_libero_episode(
        "libero_10", "KITCHEN_SCENE6_put_the_yellow_and_white_mug_in_the_microwave_and_close_it")
    assert [type(step) for step in expert.steps][:2] == [SlideInExpert, LeaningPushExpert]
    assert demo.attrs["success"] and len(demo.actions) < 450


@pytest.mark.parametrize("name", ["KITCHEN_SCENE2_put_the_black_bowl_at_the_front_on_the_plate",
                                  "LIVING_ROOM_SCENE5_put_the_yellow_and_white_mug_on_the_right_plate"])
@pytest.mark.extended
def test_a_placed_object_is_let_go_with_its_origin_over_the_targets(name):
    """LIBERO's (On X plate) holds within 3 cm of the plate's origin. The bowl was let go where the carry's momentum
    had taken it, 2.7 cm past the plate's centre, and the mug's outline (its handle with it) was centred over the
    plate, its origin 3 cm off: both failed this demo (libero_90 at 5 demos: 3/5 each). Now the object's origin is
    put over the target's and let go only once within PLACE_ALIGN of it."""
    from ript.experts.libero.pick_place import PickPlaceExpert

    expert, demo = scripted_libero_episode("libero_90", name, demo=0)
    assert isinstance(expert, PickPlaceExpert)
    assert demo.attrs["success"]


@pytest.mark.extended
def test_a_bowl_under_a_drawer_is_set_aside_and_still_goes_in_within_libero_goals_300_steps():
    """libero_goal's (Open top drawer) and (In bowl top drawer): the open drawer would hang over the bowl, so the bowl
    is set aside first; setting it aside, opening the drawer and putting it in took 313-321 steps, over the suite's 300
    (the set-aside was off there: 1/5). Only in such a sequence, the picks come down fast, the drawer's hand lines up
    while it turns and turns back early, and the bowl is carried 5 cm over the drawer, not 10: demo 1 took 283 steps
    with the first two, 276 with all four, leaving room for the layouts that need more."""
    from ript.experts.libero.articulated import SlideOpenExpert
    from ript.experts.libero.set_aside import SetAsideExpert

    expert, demo = scripted_libero_episode("libero_goal", "open_the_top_drawer_and_put_the_bowl_inside", demo=1)
    assert isinstance(expert.steps[0], SetAsideExpert) and expert.steps[0].fast_descent
    assert isinstance(expert.steps[1], SlideOpenExpert) and expert.steps[1].hurried
    assert demo.attrs["success"] and len(demo.actions) <= 280
