"""A world model's success head trained again on the model's own open-loop imagination of its episodes
(``ript world-model-head``): the episodes' chunks and their labels, only the head changing, the new world model's
checkpoint, its refusals, and a two-phase refresh of such a world model."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from ript.config import compose
from ript.evaluation.environments import success_threshold
from ript.model_loader import load_model
from ript.rl.refresh import WorldModelRefresh
from ript.stages import world_model, world_model_head
from ript.stages.evaluate import run as evaluate
from ript.stages.world_model_head import imagine_episodes, splits
from ript.utils.checkpoint import resolve_checkpoint_dir
from tests.helpers.cli import assert_one_line_error, ript_here, rl_overrides

pytestmark = pytest.mark.xdist_group("test_world_model_rl")  # the same process as the world model's other tests


@pytest.fixture(scope="module")
def failed_episodes(stage1_run, tmp_path_factory):
    """Two episodes per task of the stage-1 policy, cut at 12 steps: failures, recorded as episode files."""
    out = tmp_path_factory.mktemp("recorded")
    evaluate(compose("eval", [f"checkpoint={stage1_run}", f"out_dir={out}", "record_episodes=true",
                              "episodes_per_task=2", "num_workers=1", "max_episode_steps=12", "n_videos=0"]))
    return out / "episodes"


def test_every_episode_is_imagined_to_its_end_and_only_a_success_ends_on_a_positive(world_model_run,
                                                                                    failed_episodes):
    model, config = load_model(world_model_run, expect_stage="world_model")
    model.eval()
    files = [*config["metadata"]["files"], *sorted(map(str, failed_episodes.iterdir()))]
    data, _ = splits(config, files)
    chunks = imagine_episodes(model, data, "cpu", episodes_per_batch=3, ignore_chunks=1)
    starts = data.episode_start.unique()
    lengths = data.episode_end[starts] - starts
    per_episode = torch.bincount(chunks.episode, minlength=len(starts))
    assert torch.equal(per_episode, (lengths + model.chunk - 1) // model.chunk)  # ceil(length / chunk) each
    assert torch.equal(chunks.success, data.episode_success[starts])
    assert bool(chunks.success.any()) and bool((~chunks.success).any())
    positives = torch.bincount(chunks.episode[chunks.labels], minlength=len(starts))
    assert torch.equal(positives, chunks.success.long())  # one per successful episode, none in a failed one
    for e in range(len(starts)):
        mine = chunks.episode == e
        last = mine.nonzero()[-1]
        assert bool(chunks.labels[last]) == bool(chunks.success[e])
        if chunks.success[e]:  # the chunk before the last counts neither way; the rest are failures
            assert chunks.counted[mine].tolist() == [True] * (int(mine.sum()) - 2) + [False, True]
        else:
            assert bool(chunks.counted[mine].all())
    assert chunks.features.shape == (len(chunks.labels), model.success_head[0].in_features)


def test_the_head_alone_learns_and_the_world_model_with_it_is_a_checkpoint(world_model_run, failed_episodes,
                                                                           tmp_path):
    run = tmp_path / "head"
    args = [f"checkpoint={world_model_run}", f"run_dir={run}", f"episodes_dirs=[{failed_episodes}]", "steps=200",
            "batch_size=64", "lr=3e-3"]
    code, out, err = ript_here("world-model-head", *args)
    assert code == 0, err
    source = resolve_checkpoint_dir(world_model_run)
    ckpt = resolve_checkpoint_dir(run)
    assert ckpt.name == source.name
    before, after = load_file(source / "model.safetensors"), load_file(ckpt / "model.safetensors")
    assert before.keys() == after.keys()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith("success_head.") for k in changed)
    results = json.loads((run / "success_head.json").read_text())
    assert results["source"] == str(source) and results["episodes"]["train"] > 0
    assert len(results["losses"]) == 10 and results["losses"][-1] < results["losses"][0]
    model, config = load_model(run, expect_stage="world_model")
    assert config["metadata"]["success_head"]["episodes_dirs"] == [str(failed_episodes)]
    assert config["metadata"]["files"] == json.loads((source / "config.json").read_text())["metadata"]["files"]
    # environment.success_threshold=head: the threshold the head chose on the held-out episodes
    best = results["held_out"]["after"]["episode_best"]["threshold"]
    env = OmegaConf.create({"checkpoint": str(run), "success_threshold": "head", "calibration": None})
    assert success_threshold(env, config) == best and 0 < best < 1
    # asked again: a finished run is left as it is with resume=true, refused without it
    written = (ckpt / "model.safetensors").stat().st_mtime_ns
    assert ript_here("world-model-head", *args, "resume=true")[0] == 0
    assert (ckpt / "model.safetensors").stat().st_mtime_ns == written
    assert_one_line_error(ript_here("world-model-head", *args), f"run_dir {run} holds a world model already")


def test_a_folder_of_other_tasks_or_a_checkpoint_of_another_stage_is_one_line(world_model_run, stage1_run,
                                                                              tmp_path):
    assert_one_line_error(ript_here("eval", f"checkpoint={stage1_run}", "environment=world_model",
                                    f"environment.checkpoint={world_model_run}", "environment.success_threshold=head",
                                    f"out_dir={tmp_path / 'e'}"),
                          "environment.success_threshold=head: ", "has no head measured on held-out episodes")
    assert_one_line_error(ript_here("world-model-head", f"checkpoint={stage1_run}", f"run_dir={tmp_path / 'a'}"),
                          "but a world_model checkpoint is needed here")
    assert not (tmp_path / "a").exists()
    assert_one_line_error(ript_here("world-model-head", f"checkpoint={world_model_run}", f"run_dir={tmp_path / 'b'}",
                                    f"episodes_dirs=[{tmp_path}]"), "episodes_dirs: ", "holds no file")
    assert not (tmp_path / "b").exists()


def test_a_refreshed_world_model_whose_head_learnt_on_imagination_has_its_head_learn_so_again(
        stage1_run, world_model_run, failed_episodes, tmp_path):
    head_run = tmp_path / "head"
    code, _, err = ript_here("world-model-head", f"checkpoint={world_model_run}", f"run_dir={head_run}",
                             f"episodes_dirs=[{failed_episodes}]", "steps=20", "batch_size=32")
    assert code == 0, err
    cfg = compose("rl", [*rl_overrides(stage1_run, tmp_path / "rl", 2), "environment=world_model",
                         f"environment.checkpoint={head_run}", "environment.refresh_every=1",
                         "environment.refresh_steps=2"])
    refresh = WorldModelRefresh(cfg, tmp_path / "rl", {}, ["drawer-close-v3"], "cpu", 1, world_model.run,
                                world_model_head.run)
    out = refresh.folder_of(1)
    shutil.copytree(failed_episodes, out / "episodes")  # as the simulator's episodes of the refresh
    refresh.train(1, out)
    dynamics, final = resolve_checkpoint_dir(out / "world_model_dynamics"), resolve_checkpoint_dir(out / "world_model")
    recorded = json.loads((final / "config.json").read_text())
    assert recorded["metadata"]["success_head"]["source"] == str(dynamics)
    assert recorded["metadata"]["success_head"]["settings"]["steps"] == 20
    assert recorded["metadata"]["success_head"]["episodes_dirs"] == [str(failed_episodes)]
    assert str(out / "episodes" / "drawer-close-v3.hdf5") in recorded["metadata"]["files"]
    trained, tuned = load_file(dynamics / "model.safetensors"), load_file(final / "model.safetensors")
    changed = {k for k in trained if not torch.equal(trained[k], tuned[k])}
    assert changed and all(k.startswith("success_head.") for k in changed)
    assert json.loads((dynamics / "config.json").read_text())["cfg"]["init_checkpoint"] == str(head_run)
