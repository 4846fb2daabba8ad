"""RL in a world model instead of the simulator: imagined episodes start from the simulator's real first frames,
step whole chunks and end on the success head or at the horizon; an RL iteration in imagination resumes exactly,
in a denoising world model too, whose episodes draw their noise alike in any env slot; a missing, foreign or
mismatched world model is one line; ``ript world-model-eval`` measures one."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import ray
import torch
from safetensors.torch import load_file

from ript.config import compose
from ript.data.dataset import ChunkDataset, DatasetSpec
from ript.data.hdf5 import read_demos
from ript.envs.demo_starts import DemoFrames, start_frame
from ript.envs.imagination import ImaginationOptions, ImaginedRunner, InitialFrames
from ript.envs.worker_env import EpisodeSpec, PoolSettings
from ript.errors import RiptError
from ript.evaluation.imagination import THRESHOLDS, demo_dataset, moved_error, segment_starts, threshold_curve
from ript.model_loader import load_model
from ript.policies.build import make_policy
from ript.rl.refresh import WorldModelRefresh
from ript.stages import rl, world_model, world_model_head
from ript.stages.evaluate import run as evaluate
from ript.utils.checkpoint import resolve_checkpoint_dir
from tests.helpers.cli import assert_one_line_error, ript_here, rl_overrides, world_model_overrides

SPECS = [EpisodeSpec("drawer-close-v3", seed, j) for seed in (3, 4) for j in range(2)]


# one test process runs this file's tests (pytest-xdist, --dist loadgroup), so its module fixture is built once
pytestmark = pytest.mark.xdist_group("test_world_model_rl")


@pytest.fixture(scope="module")
def imagined(world_model_run, stage1_run):
    """The world model, a sampling policy of the stage-1 run and the simulator's first frames of SPECS."""
    model, _ = load_model(world_model_run)
    policy_model, ckpt = load_model(stage1_run)
    initial = InitialFrames("metaworld", ckpt["metadata"]["env_args"]["render"], 13, 2, PoolSettings(60.0, 1))
    try:
        initial.ensure([(s.task_name, s.seed) for s in SPECS])
    finally:
        initial.close()  # rendered: the frames are kept, the workers are not needed
    yield model, lambda: make_policy(policy_model, {**ckpt["metadata"]["sampling"], "temperature": 3.0}, "cpu", 0,
                                     False), initial


@pytest.mark.parametrize("threshold, success, length", [(0.999, False, 13), (1e-3, True, 2)])
def test_imagined_episodes_step_whole_chunks_and_end_on_the_head_or_the_horizon(imagined, threshold, success, length):
    model, make, initial = imagined
    runner = ImaginedRunner(model, ImaginationOptions(["drawer-close-v3"], 13, 3, threshold), initial, "cpu")
    policy = make()
    policy.start_recording()
    out = runner.run(policy, specs=SPECS)
    episodes = out["episodes"]
    assert [(e["success"], e["length"]) for e in episodes] == [(success, length)] * 4
    # a decision per planned chunk of 8 actions (4 world-model steps of 2), the horizon cutting the last one short
    assert [len(e["decisions"]) for e in episodes] == [2 if length == 13 else 1] * 4
    assert [e["chunk_rewards"] for e in episodes] == [[0.0, 0.0] if length == 13 else [1.0]] * 4
    assert out["env_steps"] == 4 * length and out["cancelled"] == 0
    again = runner.run(make(), specs=SPECS)["episodes"]
    assert [(e["success"], e["length"]) for e in again] == [(e["success"], e["length"]) for e in episodes]


def test_an_imagined_episode_starts_from_the_simulators_first_frame_and_moves(imagined):
    model, make, initial = imagined
    first = initial[("drawer-close-v3", 3)]
    assert first["corner_rgb"].shape == (32, 32, 3) and first["corner_rgb"].std() > 10  # a rendered scene
    obs = {k: torch.from_numpy(np.stack([first[k]])) for k in (*model.image_keys, *model.lowdim_keys)}
    nxt, _ = model.step(obs, torch.tensor([model.task_index("drawer-close-v3")]), torch.ones(1, 2, 4))
    assert not torch.equal(nxt["robot_states"], obs["robot_states"])  # the state moves with the actions


@pytest.fixture(scope="module")
def denoising_world_model(tiny_data, tmp_path_factory) -> Path:
    """A world model that draws what its warped frame lacks by denoising (``algo.model.output=warp_diffusion``, which
    runs both the regressing and the denoising network), a few steps trained."""
    run_dir = tmp_path_factory.mktemp("runs") / "denoising_world_model"
    settings = ["algo.model.output=warp_diffusion", "algo.model.denoise_steps=2", "algo.model.cond_noise=0.05"]
    world_model.run(compose("world_model", [*world_model_overrides(tiny_data, run_dir, 6), *settings]))
    return run_dir


def test_a_denoising_world_model_imagines_an_episode_alike_in_any_env_slot(imagined, denoising_world_model):
    """Each episode draws its frames' noise from a stream of its own: run one at a time or three together, each
    episode's success head sees the same frames (its highest probability is the same)."""
    _, make, initial = imagined
    model, _ = load_model(denoising_world_model)
    peaks = []
    for envs in (1, 3):
        runner = ImaginedRunner(model, ImaginationOptions(["drawer-close-v3"], 13, envs, None), initial, "cpu")
        peaks.append([e["success_peak"] for e in runner.run(make(), specs=SPECS)["episodes"]])
    assert peaks[0] == pytest.approx(peaks[1], rel=1e-5)
    assert len(set(peaks[0])) == len(SPECS)  # the frames, and so the head, differ from episode to episode


def test_a_refreshed_denoising_world_model_is_drawn_in_the_steps_set_for_the_one_it_replaces(imagined,
                                                                                             denoising_world_model):
    _, _, initial = imagined
    model, _ = load_model(denoising_world_model)
    model.set_denoise_steps(1)
    runner = ImaginedRunner(model, ImaginationOptions(["drawer-close-v3"], 13, 2, None), initial, "cpu")
    refreshed, _ = load_model(denoising_world_model)
    assert refreshed.sampling_steps == 2
    runner.use_model(refreshed)
    assert runner.model is refreshed and refreshed.sampling_steps == 1


def test_a_head_learnt_on_frames_drawn_in_fewer_steps_keeps_them_as_its_world_models_own(
        stage1_run, tiny_data, denoising_world_model, tmp_path):
    """...and a two-phase refresh of that world model goes on from it, its head learning on one-step frames again."""
    run = tmp_path / "head"
    results = world_model_head.run(compose("world_model_head", [f"checkpoint={denoising_world_model}",
                                                                f"run_dir={run}", "denoise_steps=1", "steps=20"]))
    assert results["settings"]["denoise_steps"] == 1
    model, config = load_model(run)
    assert model.sampling_steps == 1 and config["model_kwargs"]["denoise_steps"] == 1
    assert load_model(denoising_world_model)[0].sampling_steps == 2  # the source is left as it was
    cfg = compose("rl", [*rl_overrides(stage1_run, tmp_path / "rl", 2), "environment=world_model",
                         f"environment.checkpoint={run}", "environment.refresh_every=1", "environment.refresh_steps=2"])
    refresh = WorldModelRefresh(cfg, tmp_path / "rl", {}, ["drawer-close-v3"], "cpu", 1, world_model.run,
                                world_model_head.run)
    out = refresh.folder_of(1)
    (out / "episodes").mkdir(parents=True)  # the demos of one task stand for the simulator's episodes of the refresh
    shutil.copy(next(tiny_data.glob("drawer-close-v3*.hdf5")), out / "episodes" / "drawer-close-v3.hdf5")
    refresh.train(1, out)
    assert load_model(out / "world_model")[0].sampling_steps == 1


def test_an_rl_iteration_in_a_denoising_world_model_resumes_exactly(stage1_run, denoising_world_model, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    rl.run(compose("rl", imagined_rl(stage1_run, denoising_world_model, full, 2)))
    rl.run(compose("rl", imagined_rl(stage1_run, denoising_world_model, part, 1)))
    rl.run(compose("rl", imagined_rl(stage1_run, denoising_world_model, part, 2, "resume=true")))
    a = load_file(str(full / "checkpoints" / "last" / "model.safetensors"))
    b = load_file(str(part / "checkpoints" / "last" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((full / "rl_history.json").read_text()) == json.loads((part / "rl_history.json").read_text())


def imagined_rl(stage1_run, world_model_run, run_dir, iterations: int, *extra: str) -> list[str]:
    return [*rl_overrides(stage1_run, run_dir, iterations), "environment=world_model",
            f"environment.checkpoint={world_model_run}", "environment.envs=4", "rl.advantage=gae",
            "rl.entropy_coef=0.01", *extra]


def test_an_rl_iteration_in_the_world_model_resumes_exactly(stage1_run, world_model_run, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    rl.run(compose("rl", imagined_rl(stage1_run, world_model_run, full, 2)))
    rl.run(compose("rl", imagined_rl(stage1_run, world_model_run, part, 1)))
    # resumed with the world model in a rollout actor of its own (a Ray instance of this host), which gets the
    # trainer's weights and critic before its rollouts: the same run
    try:
        rl.run(compose("rl", imagined_rl(stage1_run, world_model_run, part, 2, "resume=true",
                                         "placement.mode=disaggregated")))
    finally:
        ray.shutdown()
    for name in ("model.safetensors", "critic.safetensors"):
        a = load_file(str(full / "checkpoints" / "last" / name))
        b = load_file(str(part / "checkpoints" / "last" / name))
        assert all(torch.equal(a[k], b[k]) for k in a), name
    trained = load_file(str(full / "checkpoints" / "last" / "model.safetensors"))
    base = load_file(str(stage1_run / "checkpoints" / "last" / "model.safetensors"))
    # the update changed the policy (the entropy bonus moves it whatever the imagined outcomes)
    assert any(not torch.equal(trained[k], base[k]) for k in base)
    history = json.loads((full / "rl_history.json").read_text())
    assert history == json.loads((part / "rl_history.json").read_text())


def test_a_missing_foreign_or_mismatched_world_model_is_one_line(stage1_run, world_model_run, tmp_path):
    base = [*rl_overrides(stage1_run, tmp_path / "r", 1), "environment=world_model"]
    assert_one_line_error(ript_here("rl", *base), "environment=world_model needs environment.checkpoint")
    foreign = tmp_path / "libero_world_model"
    shutil.copytree(world_model_run, foreign)
    config_file = foreign / "checkpoints" / "last" / "config.json"
    config = json.loads(config_file.read_text())
    config["metadata"]["suite"] = "libero_object"  # a world model of another suite
    config_file.write_text(json.dumps(config))
    larger = tmp_path / "larger_world_model"
    shutil.copytree(world_model_run, larger)
    config_file = larger / "checkpoints" / "last" / "config.json"
    config = json.loads(config_file.read_text())
    config["model_kwargs"]["image_size"] = 64  # one of the policy's suite at another image size
    config_file.write_text(json.dumps(config))
    for extra, message in [
        ([f"environment.checkpoint={stage1_run}"], "checkpoint is from stage 'stage1'"),
        ([f"environment.checkpoint={foreign}"], "models suite libero_object; the policy acts in metaworld"),
        ([f"environment.checkpoint={larger}"], "predicts 64-pixel images of cameras ['corner', 'gripperPOV']; "
                                               "the policy reads 32-pixel images"),
        ([f"environment.checkpoint={world_model_run}", "rl.reward=dense"],
         "a world model (it predicts success only) has no shaped reward"),
        ([f"environment.checkpoint={world_model_run}", "sampling.action_horizon=3"],
         "steps 2 actions at a time; the policy executes 3"),
    ]:
        with pytest.raises(RiptError, match=re.escape(message)):
            rl.run(compose("rl", [*base, *extra]))
    with pytest.raises(RiptError, match=r"environment.name='dream'.*world_model"):
        compose("rl", [*base, "environment.name=dream"])
    assert not (tmp_path / "r").exists()
    with pytest.raises(RiptError, match="environment=world_model: pass out_dir="):
        evaluate(compose("eval", [f"checkpoint={stage1_run}", "environment=world_model",
                                  f"environment.checkpoint={world_model_run}"]))


def test_eval_runs_a_checkpoint_in_the_world_model(stage1_run, world_model_run, tmp_path):
    code, _, err = ript_here("eval", f"checkpoint={stage1_run}", "environment=world_model",
                             f"environment.checkpoint={world_model_run}", "environment.envs=4", "episodes_per_task=2",
                             "num_workers=1", "max_episode_steps=20", f"out_dir={tmp_path / 'imagined'}",
                             "n_videos=1")
    assert code == 0, err
    results = json.loads((tmp_path / "imagined" / "results.json").read_text())
    assert results["environment"]["name"] == "world_model" and len(results["episodes"]) == 4
    assert sorted(results["per_task"]) == ["button-press-v3", "drawer-close-v3"]
    assert all(e["length"] <= 20 for e in results["episodes"])
    videos = sorted(p.name for p in (tmp_path / "imagined" / "videos").glob("*.mp4"))  # each task's first episode
    assert [v.split("_ep")[0] for v in videos] == ["button-press-v3", "drawer-close-v3"]
    assert all("_ep0_" in v and v.endswith("_imagined.mp4") for v in videos)


def test_world_model_eval_measures_fidelity_the_head_and_speed(world_model_run, tmp_path):
    out = tmp_path / "measures"
    args = ["world-model-eval", f"checkpoint={world_model_run}", f"out_dir={out}", "horizon_chunks=3",
            "starts_per_demo=2", "speed_envs=4", "speed_chunks=2", "n_videos=1"]
    code, stdout, err = ript_here(*args)
    assert code == 0, err
    results = json.loads((out / "results.json").read_text())
    assert [r["chunks"] for r in results["fidelity"]] == [1, 2, 3]
    first = results["fidelity"][0]
    assert first["segments"] > 0 and 5 < first["psnr"] < 60 and 0 < first["ssim"] <= 1
    assert results["head_on_real"]["positives"] > 0 and results["head_on_real"]["negatives"] > 0
    assert results["speed"]["env_steps"] == 4 * 2 * 2 and results["speed"]["env_steps_per_second"] > 0
    assert len(list((out / "videos").glob("*.mp4"))) == 1
    assert "PSNR" in stdout and "success head on real frames" in stdout
    # the references beside the model: the first frame held, and the model fed another segment's actions
    assert all(0 < first[k] < 60 for k in ("psnr_still", "psnr_other_actions"))
    assert first["moved_error_still"] > 0 and first["moved_error"] >= 0
    assert first["state_rmse_still"] > 0 and np.isfinite(first["state_rmse"] + first["state_rmse_other_actions"])
    calibration = results["head_calibration"]
    assert [row["threshold"] for row in calibration["curve"]] == list(THRESHOLDS)
    assert calibration["best_f1"] == max(row["f1"] for row in calibration["curve"])
    assert f"best F1 {calibration['best_f1']:.2f} at threshold {calibration['best_threshold']:g}" in stdout
    assert_one_line_error(ript_here(*args), "results.json exists", "overwrite=true")


def test_the_moved_pixel_error_averages_over_the_pixels_that_moved_only():
    """2x2 images, 3 channels: pixel (0, 0) moved (channel 0: 0 -> 50), pixel (1, 1) changed by 3 levels (not
    moved). The imagined frame has 10 there (error 40 in one of 3 channels: 40/3) and is off by 100 on a still
    pixel, which does not count; a frame where nothing moved scores 0."""
    first = torch.zeros(1, 3, 2, 2)
    real = first.clone()
    real[0, 0, 0, 0], real[0, 1, 1, 1] = 50.0, 3.0
    imagined = real.clone()
    imagined[0, 0, 0, 0], imagined[0, 2, 0, 1] = 10.0, 100.0
    assert moved_error(imagined, real, first).tolist() == pytest.approx([40 / 3])
    assert moved_error(imagined, first, first).tolist() == [0.0]


def test_the_head_calibration_scores_every_threshold_and_picks_the_lowest_of_the_best_f1():
    """Four chunk ends, two of them successes: probabilities 0.9 / 0.6 for the successes, 0.7 / 0.2 for the
    others. Counted by hand: at 0.1 all four fire (precision 1/2, recall 1, F1 2/3); at 0.5 two of three firings
    are right (precision 2/3, recall 1, F1 0.8); at 0.65 one of two (F1 1/2); at 0.8 one of one (precision 1,
    recall 1/2, F1 2/3); at 0.95 none fires."""
    probs = torch.tensor([0.9, 0.6, 0.7, 0.2])
    labels = torch.tensor([True, True, False, False])
    result = threshold_curve(probs, labels, thresholds=(0.1, 0.5, 0.65, 0.8, 0.95))
    f1 = {row["threshold"]: row["f1"] for row in result["curve"]}
    assert f1[0.1] == pytest.approx(2 / 3)
    assert f1[0.5] == pytest.approx(0.8) and f1[0.65] == pytest.approx(0.5) and f1[0.8] == pytest.approx(2 / 3)
    assert f1[0.95] == 0.0
    assert result["best_threshold"] == 0.5 and result["best_f1"] == pytest.approx(0.8)
    tied = threshold_curve(torch.tensor([0.9, 0.1]), torch.tensor([True, False]), thresholds=(0.3, 0.5, 0.8))
    assert tied["best_threshold"] == 0.3  # every threshold separates them: the lowest is kept


def test_world_model_eval_measures_a_policys_recorded_episodes_within_each_episode(stage1_run, world_model_run,
                                                                                     tmp_path):
    """Recorded episodes of one task (the model knows two) keep the model's task id, and a segment is scored only
    while its episode has real frames: a failed episode stops at its time limit, a successful one at its end."""
    recorded = tmp_path / "recorded"
    evaluate(compose("eval", [f"checkpoint={stage1_run}", f"out_dir={recorded}", "record_episodes=true",
                              "episodes_per_task=2", "num_workers=1", "max_episode_steps=15", "n_videos=0",
                              "task_names=[drawer-close-v3]"]))
    model, config = load_model(world_model_run)
    files = [recorded / "episodes" / "drawer-close-v3.hdf5"]
    data = demo_dataset(config, 5, "all", files)
    assert model.task_names.index("drawer-close-v3") == 1 and data.task_ids.unique().tolist() == [1]
    out = tmp_path / "measured"
    code, _, err = ript_here("world-model-eval", f"checkpoint={world_model_run}", f"out_dir={out}",
                             f"episodes_dir={recorded / 'episodes'}", "horizon_chunks=5", "starts_per_demo=2",
                             "speed_envs=2", "speed_chunks=1", "n_videos=0")
    assert code == 0, err
    results = json.loads((out / "results.json").read_text())
    starts = segment_starts(data, 2)
    left = (data.episode_end[starts] - starts).tolist()
    success = data.episode_success[starts].tolist()
    expected = [sum(1 for n_left, ok in zip(left, success) if (h + 1) * model.chunk < n_left or
                    (ok and h * model.chunk < n_left)) for h in range(5)]
    assert [r["segments"] for r in results["fidelity"]] == expected and expected[0] > expected[4]
    assert results["demos"] == 2 and results["episodes_dir"] == str(recorded / "episodes")
    assert results["split"] == "all"
    missing = tmp_path / "unmeasured"
    assert_one_line_error(ript_here("world-model-eval", f"checkpoint={world_model_run}", f"out_dir={missing}",
                                    f"episodes_dir={tmp_path}"), "error: episodes_dir: ", "holds no file")
    assert not missing.exists()  # refused before anything is written


def test_recorded_episodes_become_demonstration_files_a_world_model_trains_on(stage1_run, tiny_data, tmp_path):
    out = tmp_path / "recorded"
    results = evaluate(compose("eval", [f"checkpoint={stage1_run}", f"out_dir={out}", "record_episodes=true",
                                        "episodes_per_task=2", "num_workers=1", "max_episode_steps=20",
                                        "n_videos=0"]))
    folder = out / "episodes"
    assert sorted(p.name for p in folder.iterdir()) == ["button-press-v3.hdf5", "drawer-close-v3.hdf5"]
    for task in ("button-press-v3", "drawer-close-v3"):
        episodes = sorted((e for e in results["episodes"] if e["task"] == task),
                          key=lambda e: (e["seed"], e["episode"]))
        demos = read_demos(folder / f"{task}.hdf5", {"corner_rgb": "corner_rgb", "gripperPOV_rgb": "gripperPOV_rgb",
                                                     "robot_states": "robot_states"}, flip_keys=("corner_rgb",))
        assert [len(d.actions) for d in demos] == [e["length"] for e in episodes]
        assert [bool(d.attrs["success"]) for d in demos] == [e["success"] for e in episodes]
        first = np.concatenate([demos[0].obs["corner_rgb"][0], demos[0].obs["gripperPOV_rgb"][0]], axis=1)
        assert np.array_equal(first, results["first_frames"][task])  # upright as the env gave it (no flip)
        assert demos[0].actions.shape[1] == 4 and demos[0].obs["robot_states"].shape[0] == len(demos[0].actions)
    # beside the demos: a failed episode's last chunk is no success to predict
    spec = DatasetSpec(files=[tiny_data / "drawer-close-v3.hdf5", folder / "drawer-close-v3.hdf5"],
                       obs_keys={"corner_rgb": "corner_rgb", "robot_states": "robot_states"}, chunk_size=2,
                       val_fraction=0.0, future_every=2, future_count=1)
    data = ChunkDataset(spec, "all")
    assert data.task_names == ["drawer-close-v3"] and int(data.task_ids.max()) == 0
    done = data.get_batch(torch.arange(len(data)))["future_done"][:, 0]
    failed = ~data.episode_success
    assert bool(failed.any()) and not bool(done[failed].any()) and bool(done[~failed].any())
    run = tmp_path / "world_model"
    world_model.run(compose("world_model", [*world_model_overrides(tiny_data, run, 2),
                                            f"data.extra_dirs=[{folder}]"]))
    recorded = json.loads((run / "checkpoints" / "last" / "config.json").read_text())["metadata"]["files"]
    assert str(folder / "drawer-close-v3.hdf5") in recorded and len(recorded) == 4
    with pytest.raises(RiptError, match="holds no file of the tasks"):
        world_model.run(compose("world_model", [*world_model_overrides(tiny_data, tmp_path / "w2", 2),
                                                f"data.extra_dirs=[{tmp_path}]"]))
    assert not (tmp_path / "w2").exists()


def test_a_world_model_recorded_before_settings_were_added_starts_another_run(world_model_run, tiny_data, tmp_path):
    """Its recorded kwargs lack the model's later settings (it was built, and loads, with their defaults): a run
    going on from it starts; one that asks for another value of such a setting is refused, naming the default."""
    old = tmp_path / "old"
    shutil.copytree(resolve_checkpoint_dir(world_model_run), old)
    config = json.loads((old / "config.json").read_text())
    for added in ("state_head", "feed_back"):
        config["model_kwargs"].pop(added)
    (old / "config.json").write_text(json.dumps(config))
    world_model.run(compose("world_model", [*world_model_overrides(tiny_data, tmp_path / "on", 1),
                                            f"init_checkpoint={old}"]))
    assert (tmp_path / "on" / "checkpoints" / "last" / "model.safetensors").is_file()
    with pytest.raises(RiptError, match="has state_head='bottleneck'; this run builds state_head='dynamics'"):
        world_model.run(compose("world_model", [*world_model_overrides(tiny_data, tmp_path / "other", 1),
                                                f"init_checkpoint={old}", "algo.model.state_head=dynamics"]))


@pytest.mark.extended
def test_a_world_model_refreshed_on_real_episodes_mid_run_resumes_exactly(stage1_run, world_model_run, tmp_path):
    refresh = ["environment.refresh_every=1", "environment.refresh_episodes=1", "environment.refresh_steps=2"]
    full, part = tmp_path / "full", tmp_path / "part"
    rl.run(compose("rl", imagined_rl(stage1_run, world_model_run, full, 2, *refresh)))
    rl.run(compose("rl", imagined_rl(stage1_run, world_model_run, part, 1, *refresh)))
    assert not (part / "world_model_refresh").exists()  # the first refresh comes before the second iteration
    rl.run(compose("rl", imagined_rl(stage1_run, world_model_run, part, 2, *refresh, "resume=true")))
    for folder in (full, part):
        made = folder / "world_model_refresh" / "iter00001"
        assert json.loads((made / "refresh.json").read_text())["real_env_steps"] > 0
        assert sorted(p.name for p in (made / "episodes").iterdir()) == ["drawer-close-v3.hdf5"]
        recorded = json.loads((made / "world_model" / "checkpoints" / "last" / "config.json").read_text())
        assert recorded["cfg"]["init_checkpoint"] == str(world_model_run)
        assert str(made / "episodes" / "drawer-close-v3.hdf5") in recorded["metadata"]["files"]
    for name in ("model.safetensors", "critic.safetensors"):
        a = load_file(str(full / "checkpoints" / "last" / name))
        b = load_file(str(part / "checkpoints" / "last" / name))
        assert all(torch.equal(a[k], b[k]) for k in a), name
    refreshed = [load_file(str(f / "world_model_refresh" / "iter00001" / "world_model" / "checkpoints" / "last" /
                               "model.safetensors")) for f in (full, part)]
    assert all(torch.equal(refreshed[0][k], refreshed[1][k]) for k in refreshed[0])
    base = load_file(str(world_model_run / "checkpoints" / "last" / "model.safetensors"))
    assert any(not torch.equal(base[k], refreshed[0][k]) for k in base)  # it trained on
    assert json.loads((full / "rl_history.json").read_text()) == json.loads((part / "rl_history.json").read_text())


def test_imagined_episodes_from_demo_frames_start_on_a_real_frame_and_last_a_few_chunks(world_model_run, imagined):
    model, make, _ = imagined
    _, config = load_model(world_model_run)
    starts = DemoFrames.of_world_model(config, [*model.image_keys, *model.lowdim_keys])
    specs = [EpisodeSpec("drawer-close-v3", seed, j) for seed in range(3) for j in range(2)]
    runner = ImaginedRunner(model, ImaginationOptions(["drawer-close-v3"], 3 * model.chunk, 4, 0.999), starts, "cpu")
    out = runner.run(make(), specs=specs)
    assert [e["length"] for e in out["episodes"]] == [3 * model.chunk] * 6  # the head never fires at 0.999
    files = {name: f for name, f in zip(config["metadata"]["task_names"], config["metadata"]["files"], strict=True)}
    demos = read_demos(Path(files["drawer-close-v3"]), {"robot_states": "robot_states"})
    for seed in range(3):
        demo = demos[seed % len(demos)]
        t = start_frame("drawer-close-v3", seed, len(demo.actions))
        assert np.array_equal(starts[("drawer-close-v3", seed)]["robot_states"], demo.obs["robot_states"][t])
    assert len({start_frame("drawer-close-v3", seed, 100) for seed in range(20)}) > 10  # spread along the demo


def test_rl_in_the_world_model_from_demo_frames(stage1_run, world_model_run, tmp_path):
    run_dir = tmp_path / "demo_starts"
    rl.run(compose("rl", imagined_rl(stage1_run, world_model_run, run_dir, 1, "environment.starts=demo_frames",
                                     "environment.start_chunks=2")))
    (entry,) = json.loads((run_dir / "rl_history.json").read_text())
    assert 0 < entry["env_steps"] <= entry["episodes"] * 2 * 2  # two chunks of the world model's 2 actions at most
