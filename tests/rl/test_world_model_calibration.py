"""The world model's success head read for one policy: its simulator episodes run again in the world model to the
horizon, the threshold that best separates their real successes from their failures kept in calibration.json, and
RL or an evaluation in the world model reading it (``environment.calibration``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from omegaconf import OmegaConf

from ript.config import compose
from ript.envs.episodes import protocol_specs, repeated_layouts
from ript.errors import RiptError
from ript.evaluation.calibration import (
    calibrate,
    calibrated_threshold,
    calibration_line,
    calibration_table,
    check_rewards_follow_simulator,
    pooled_balanced_accuracy,
    same_start,
    simulator_episodes,
)
from ript.evaluation.environments import EnvironmentSetting, build_environment
from ript.model_loader import load_model
from ript.policies.build import make_policy
from ript.utils.checkpoint import resolve_checkpoint_dir
from tests.helpers.cli import assert_one_line_error, ript_here, rl_overrides

pytestmark = pytest.mark.xdist_group("test_world_model_rl")  # the same process as the world model's other tests


def episode(task: str, seed: int, success: bool, peak: float | None = None) -> dict:
    e = {"task": task, "seed": seed, "episode": 0, "success": success}
    return e if peak is None else {**e, "success_peak": peak}


def test_the_threshold_kept_best_separates_the_real_successes_from_the_failures():
    """Real: a, a, b succeed; b, b fail. Peaks 0.9, 0.5, 0.3 (successes) and 0.4, 0.1 (failures): at 0.3 every
    success and one failure are imagined successes (balanced accuracy 3/4), at 0.42-0.5 two successes and no
    failure (5/6), the best (agreement 4/5); those five thresholds tie, imagined success 2/5 at each, so the lowest
    is kept."""
    real = [episode("a", 1, True), episode("a", 2, True), episode("b", 1, True), episode("b", 2, False),
            episode("b", 3, False)]
    imagined = [episode("a", 1, False, 0.9), episode("a", 2, False, 0.5), episode("b", 1, False, 0.3),
                episode("b", 2, False, 0.4), episode("b", 3, False, 0.1)]
    result = calibrate(real, imagined)
    assert result["threshold"] == 0.42 and result["balanced_accuracy"] == pytest.approx(5 / 6)
    assert result["agreement"] == pytest.approx(4 / 5)
    assert result["real_success"] == pytest.approx(3 / 5) and result["imagined_success"] == pytest.approx(2 / 5)
    assert result["per_task"] == {
        "a": {"real": 1.0, "imagined": 1.0, "balanced_accuracy": 1.0, "episodes": 2, "real_successes": 2,
              "successes_imagined": 2, "real_failures": 0, "failures_imagined": 0,
              "own_threshold": 0.02, "own_balanced_accuracy": 1.0},
        "b": {"real": pytest.approx(1 / 3), "imagined": 0.0, "balanced_accuracy": 0.5, "episodes": 3,
              "real_successes": 1, "successes_imagined": 0, "real_failures": 2, "failures_imagined": 0,
              # b alone: its success peaked at 0.3, its failures at 0.4 and 0.1; 0.02-0.1 imagine all three
              # successes (1/2), 0.12-0.3 the success and the 0.4 failure (3/4), above 0.4 none (1/2)
              "own_threshold": 0.12, "own_balanced_accuracy": 0.75}}
    # the tasks' counts pooled give back the whole run's balanced accuracy
    assert pooled_balanced_accuracy(list(result["per_task"].values())) == pytest.approx(5 / 6)
    assert pooled_balanced_accuracy([result["per_task"]["b"]]) == 0.5
    assert pooled_balanced_accuracy([result["per_task"]["a"]]) == 1.0  # no real failure: its successes alone
    assert calibration_table(result).splitlines()[2].split() == ["b", "33.3%", "0.0%", "50.0%", "75.0%", "at", "0.12"]
    at_030 = next(r for r in result["curve"] if r["threshold"] == 0.3)
    assert at_030["balanced_accuracy"] == pytest.approx(0.75) and at_030["imagined_success"] == pytest.approx(4 / 5)
    with pytest.raises(RiptError, match=r"no episode \('b', 3, 0\)"):
        calibrate(real, imagined[:4])


def test_episodes_from_one_start_give_the_simulator_against_itself_and_the_models_order_within_it():
    """Start a/1: real won, won, lost, lost; imagined won, lost, lost, lost (peaks .9 .2 .1 .1). Start a/2: won,
    lost, lost, lost; imagined won, lost, won, lost (peaks .8 .3 .9 .1). Of the 7 pairs that ended differently
    the outcomes order 4 as the simulator and tie 3; the peaks order 6 as the simulator and 1 the other way."""
    starts = [("a", 1)] * 4 + [("a", 2)] * 4
    won = np.array([1, 1, 0, 0, 1, 0, 0, 0], bool)
    imagined = np.array([1, 0, 0, 0, 1, 0, 1, 0], bool)
    found = same_start(starts, won, imagined, np.array([.9, .2, .1, .1, .8, .3, .9, .1]))
    # one episode's outcome read as another's from its start: of the 9 ordered pairs whose truth is a success
    # (a/1: 2 x 3, a/2: 1 x 3), 2 read one; of the 15 whose truth is a failure (a/1: 2 x 3, a/2: 3 x 3), 8 read one
    assert found == {"starts": 2, "episodes": 8, "simulator_balanced_accuracy": pytest.approx((2 / 9 + 8 / 15) / 2),
                     "pairs_ended_differently": 7, "ordered_as_simulator": 4, "ordered_otherwise": 0, "tied": 3,
                     "order_score": pytest.approx(4 / 7), "peaks_ordered_as_simulator": 6,
                     "peaks_ordered_otherwise": 1, "peak_order_auc": pytest.approx(6 / 7),
                     "order_p_value": pytest.approx(8 / 128)}  # 6 or 7 of 7 by a coin: (7 + 1) / 2^7
    # equal peaks count half in the AUC and not in the test
    tied = same_start(starts[:2] + starts[4:6], np.array([1, 0, 1, 0], bool), np.zeros(4, bool),
                      np.array([.5, .5, .7, .2]))
    assert tied["peak_order_auc"] == 0.75 and tied["peaks_ordered_as_simulator"] == 1
    assert tied["order_p_value"] == 0.5 and tied["tied"] == 2
    assert same_start([("a", 1), ("a", 2)], won[:2], imagined[:2], np.zeros(2)) is None  # one episode a start
    line = calibration_line({**calibrate([episode("a", 1, True), episode("a", 2, False)],
                                         [episode("a", 1, False, .9), episode("a", 2, False, .1)]),
                             "same_start": found})
    assert "the simulator against itself from the same 2 starts: balanced accuracy 37.8%" in line
    assert ("put 4 in the simulator's order, 0 in the other and tied 3, its success peaks 6 in the simulator's "
            "order and 1 in the other (sign test p=0.062)") in line


def test_repeated_layouts_run_each_start_under_several_noise_streams():
    specs = protocol_specs(["a", "b"], 4, 0, 1)
    again = repeated_layouts(specs, 2)
    assert [(s.task_name, s.index) for s in again] == [(s.task_name, s.index) for s in specs]  # noise streams kept
    seeds = {(s.task_name, s.index): s.seed for s in specs}
    assert [s.seed for s in again if s.task_name == "a"] == [seeds["a", 0], seeds["a", 0], seeds["a", 2],
                                                             seeds["a", 2]]
    assert len({s.key for s in again}) == 8 and again[0].record  # distinct noise, the videos kept
    assert repeated_layouts(specs, 1) == specs
    with pytest.raises(ValueError, match="episode 3 of a: no episode 2 of its task"):
        repeated_layouts([s for s in specs if s.index != 2], 2)


def test_a_task_the_policy_solves_but_never_in_imagination_is_named():
    real = [episode("a", 1, True), episode("a", 2, False), episode("b", 1, True), episode("c", 1, False)]
    imagined = [episode("a", 1, False, 0.9), episode("a", 2, False, 0.1), episode("b", 1, False, 0.01),
                episode("c", 1, False, 0.0)]
    result = calibrate(real, imagined)
    assert result["tasks_never_imagined_successful"] == ["b"]  # c never succeeds for real either
    assert calibration_line(result).endswith("the head stayed below 0.02 in every imagined episode of 1 task(s) the "
                                             "policy solves (b): RL gets no reward there")
    assert "RL gets no reward" not in calibration_line({**result, "tasks_never_imagined_successful": []})
    assert "at chance" not in calibration_line(result)


def test_a_head_that_never_fires_in_imagination_is_said_to_calibrate_at_chance():
    real = [episode("a", 1, True), episode("a", 2, False), episode("b", 1, True)]
    imagined = [episode("a", 1, False, 0.001), episode("a", 2, False, 0.0), episode("b", 1, False, 0.01)]
    result = calibrate(real, imagined)
    assert result["balanced_accuracy"] == 0.5 and result["imagined_success"] == 0.0
    assert "no threshold separates the real successes from the failures (at chance), so 0.02 is only the " \
           "tie-break's choice" in calibration_line(result)


def environment(**settings):
    return OmegaConf.create({"name": "world_model", "calibration": None, "min_calibrated_accuracy": 0.6,
                             "min_task_calibrated_accuracy": 0.0, "max_order_p_value": 0.05, **settings})


def task_rows(**accuracies: tuple[int, int, int, int]) -> dict:
    """Per-task calibration rows from (real successes, of them imagined, real failures, of them imagined)."""
    return {t: {"real": s / (s + f), "imagined": (si + fi) / (s + f),
                "balanced_accuracy": pooled_balanced_accuracy([dict(real_successes=s, successes_imagined=si,
                                                                     real_failures=f, failures_imagined=fi)]),
                "episodes": s + f, "real_successes": s, "successes_imagined": si, "real_failures": f,
                "failures_imagined": fi} for t, (s, si, f, fi) in accuracies.items()}


def test_rl_keeps_the_tasks_calibrated_well_enough_and_gates_on_them_together(tmp_path):
    """a: 8 of 8 successes and 1 of 2 failures told apart (75%); b: successes imagined at random (50%); c: every
    episode imagined a success (50%). All three pooled: 16 of 18 successes and 3 of 8 failures told apart, 63.2%."""
    rows = task_rows(a=(8, 8, 2, 1), b=(4, 2, 4, 2), c=(6, 6, 2, 2))
    (tmp_path / "calibration.json").write_text(json.dumps({"balanced_accuracy": 0.55, "per_task": rows}))
    env = environment(calibration=str(tmp_path))
    with pytest.raises(RiptError, match="balanced accuracy 55.0%, below environment.min_calibrated_accuracy=0.6"):
        check_rewards_follow_simulator(env)
    assert check_rewards_follow_simulator(environment(calibration=str(tmp_path), min_calibrated_accuracy=0)) is None
    assert check_rewards_follow_simulator(environment(calibration=str(tmp_path), min_task_calibrated_accuracy=0.7)) \
        == {"a"}
    # the gate reads the kept tasks together
    with pytest.raises(RiptError, match=r"balanced accuracy 63\.2% over the 3 task\(s\) kept, below environment."
                                        r"min_calibrated_accuracy=0\.7"):
        check_rewards_follow_simulator(environment(calibration=str(tmp_path), min_task_calibrated_accuracy=0.5,
                                                   min_calibrated_accuracy=0.7))
    with pytest.raises(RiptError, match=r"no task reaches environment.min_task_calibrated_accuracy=0.8 \(the best: "
                                        r"a, 75\.0%\)"):
        check_rewards_follow_simulator(environment(calibration=str(tmp_path), min_task_calibrated_accuracy=0.8))
    (tmp_path / "calibration.json").write_text(json.dumps({"balanced_accuracy": 0.7, "per_task": {
        "a": {"real": 1.0, "imagined": 1.0}}}))
    with pytest.raises(RiptError, match="has no per-task balanced accuracy, which environment.min_task_calibrated_"
                                        "accuracy reads"):
        check_rewards_follow_simulator(environment(calibration=str(tmp_path), min_task_calibrated_accuracy=0.7))
    with pytest.raises(RiptError, match="min_task_calibrated_accuracy=0.7 reads a world model's calibration"):
        check_rewards_follow_simulator(environment(name="simulator", min_task_calibrated_accuracy=0.7))


def test_rl_is_refused_where_the_model_orders_a_starts_episodes_no_better_than_a_coin(tmp_path):
    """MetaWorld pick-place's model: its peaks put 47 of 91 differing pairs in the simulator's order, 44 in the
    other (p=0.42)."""
    order = {"pairs_ended_differently": 91, "peaks_ordered_as_simulator": 47, "peaks_ordered_otherwise": 44,
             "order_p_value": 0.42}
    (tmp_path / "calibration.json").write_text(json.dumps({"balanced_accuracy": 0.7, "same_start": order}))
    with pytest.raises(RiptError, match=r"success peaks put 47 in the simulator's order and 44 in the other \(sign "
                                        r"test p=0\.42, above environment.max_order_p_value=0.05\)"):
        check_rewards_follow_simulator(environment(calibration=str(tmp_path)))
    assert check_rewards_follow_simulator(environment(calibration=str(tmp_path), max_order_p_value=1)) is None
    assert check_rewards_follow_simulator(environment(calibration=str(tmp_path), max_order_p_value=0.5)) is None
    # without episodes from one start (or none that ended differently) there is nothing to read: not refused
    for nothing_to_read in (None, {**order, "pairs_ended_differently": 0}):
        (tmp_path / "calibration.json").write_text(json.dumps({"balanced_accuracy": 0.7,
                                                               "same_start": nothing_to_read}))
        assert check_rewards_follow_simulator(environment(calibration=str(tmp_path))) is None


def test_a_simulator_evaluation_of_another_checkpoint_or_none_is_refused(tmp_path):
    folder = tmp_path / "real"
    with pytest.raises(RiptError, match="no results.json there"):
        simulator_episodes(folder, {"checkpoint": "a"})
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({"checkpoint": str(tmp_path / "a"), "episodes": [{}]}))
    with pytest.raises(RiptError, match=f"evaluated checkpoint {tmp_path / 'a'}, not {tmp_path / 'b'}"):
        simulator_episodes(folder, {"checkpoint": str(tmp_path / "b")})
    (folder / "results.json").write_text(json.dumps({"checkpoint": "a", "episodes": [{}],
                                                     "environment": {"name": "world_model"}}))
    with pytest.raises(RiptError, match="ran in world_model, not the simulator"):
        simulator_episodes(folder, {"checkpoint": "a"})


def test_a_policy_calibrates_the_head_and_an_imagined_run_reads_it(stage1_run, world_model_run, tmp_path):
    real, out = tmp_path / "real", tmp_path / "calibrated"
    common = [f"checkpoint={stage1_run}", "episodes_per_task=2", "num_workers=1", "max_episode_steps=12", "n_videos=0"]
    code, _, err = ript_here("eval", *common, "draws_per_layout=2", f"out_dir={real}")  # each task's 2 from 1 start
    assert code == 0, err
    written = json.loads((real / "results.json").read_text())
    starts = [(e["task"], e["seed"], e["episode"]) for e in written["episodes"]]
    assert written["draws_per_layout"] == 2
    assert len({s[:2] for s in starts}) == 2 and sorted(s[2] for s in starts) == [0, 0, 1, 1]
    imagined = [*common, "environment=world_model", f"environment.checkpoint={world_model_run}", "environment.envs=4"]
    assert_one_line_error(ript_here("eval", *imagined, "draws_per_layout=2", f"calibrate_against={real}",
                                    f"out_dir={tmp_path / 'z'}"), "draws_per_layout=2 with calibrate_against")
    code, _, err = ript_here("eval", *imagined, f"calibrate_against={real}", f"out_dir={out}")
    assert code == 0, err
    found = json.loads((out / "calibration.json").read_text())
    assert found["same_start"]["starts"] == 2 and found["same_start"]["episodes"] == 4
    assert found["episodes"] == 4 and found["world_model"] == str(resolve_checkpoint_dir(world_model_run))
    assert found["checkpoint"] == json.loads((real / "results.json").read_text())["checkpoint"]
    assert 0 < found["threshold"] < 1 and len(found["curve"]) == 49
    episodes = json.loads((out / "results.json").read_text())["episodes"]
    assert all(e["length"] == 12 and not e["success"] and 0 <= e["success_peak"] <= 1 for e in episodes)
    # RL and evaluations in this world model read the threshold
    cfg = compose("eval", [*imagined, f"environment.calibration={out}", f"out_dir={tmp_path / 'x'}"])
    model, ckpt = load_model(stage1_run)
    policy = make_policy(model, ckpt["metadata"]["sampling"], "cpu", 0, False)
    setting = EnvironmentSetting(cfg.environment, cfg.workers, ckpt["metadata"], ["drawer-close-v3"], policy, "cpu",
                                 1, 12, 2)
    runner = build_environment(setting)
    try:
        assert runner.options.success_threshold == found["threshold"]
    finally:
        runner.close()
    # measured in another world model: refused, naming both
    other = tmp_path / "other"
    other.mkdir()
    (other / "calibration.json").write_text(json.dumps({**found, "world_model": str(tmp_path)}))
    with pytest.raises(RiptError, match=f"was measured in world model {tmp_path}, not "):
        calibrated_threshold(other, resolve_checkpoint_dir(world_model_run))
    assert_one_line_error(ript_here("eval", *common, f"calibrate_against={real}", f"out_dir={tmp_path / 'y'}"),
                          "calibrate_against=<a simulator evaluation> calibrates a world model")


def test_rl_in_a_world_model_whose_calibration_is_at_chance_is_refused_in_one_line(stage1_run, world_model_run,
                                                                                   tmp_path):
    """RL reads the calibration's balanced accuracy before anything loads: below min_calibrated_accuracy it stops
    in one line naming the folder and leaves no run folder; 0 lets it run."""
    calibrated = tmp_path / "calibrated"
    calibrated.mkdir()
    (calibrated / "calibration.json").write_text(json.dumps(
        {"threshold": 0.06, "balanced_accuracy": 0.478, "world_model": str(resolve_checkpoint_dir(world_model_run))}))
    run_dir = tmp_path / "r"
    base = [*rl_overrides(stage1_run, run_dir, 1), "environment=world_model",
            f"environment.checkpoint={world_model_run}", "environment.envs=4", f"environment.calibration={calibrated}"]
    assert_one_line_error(ript_here("rl", *base), f"environment.calibration={calibrated}: the head told the policy's "
                          "real successes from its failures at balanced accuracy 47.8%, below "
                          "environment.min_calibrated_accuracy=0.6")
    assert not run_dir.exists()
    code, _, err = ript_here("rl", *base, "environment.min_calibrated_accuracy=0")
    assert code == 0, err
    # the same at chance over both tasks, but drawer-close told apart well enough alone: RL runs on it alone
    (calibrated / "calibration.json").write_text(json.dumps(
        {"threshold": 0.06, "balanced_accuracy": 0.478, "world_model": str(resolve_checkpoint_dir(world_model_run)),
         "per_task": task_rows(**{"drawer-close-v3": (8, 8, 2, 1), "button-press-v3": (4, 2, 4, 2)})}))
    both = [o.replace("task_names=[drawer-close-v3]", "task_names=[button-press-v3,drawer-close-v3]")
            for o in base if not o.startswith("run_dir=")]
    code, _, err = ript_here("rl", *both, f"run_dir={tmp_path / 'kept'}",
                             "environment.min_task_calibrated_accuracy=0.7")
    assert code == 0, err
    assert "RL in the world model on the 1 of 2 task(s) whose calibration reached 0.7; left out: button-press-v3 " \
           "(50%)" in "\n".join(err)
    history = json.loads((tmp_path / "kept" / "rl_history.json").read_text())
    assert [sorted(entry["per_task"]) for entry in history] == [["drawer-close-v3"]]
    with pytest.raises(RiptError, match="environment.min_calibrated_accuracy"):
        compose("rl", [*base, "environment.min_calibrated_accuracy=1.5"])
