"""Config validation, run folders, resume checks, checkpoint pruning and evaluation output placement."""

import json
import shutil

import pytest
import torch

from ript.errors import RiptError
from tests.helpers.cli import assert_one_line_error, ript_here, task_overrides, train_overrides


@pytest.mark.parametrize("job,override,fragment", [
    ("stage0", "train.steps=0", "train.steps=0"),
    ("stage0", "train.steps=-5", "train.steps=-5"),
    ("stage0", "train.batch_size=0", "train.batch_size=0"),
    ("stage0", "train.save_every=0", "train.save_every=0"),
    ("stage0", "train.keep_last=-1", "train.keep_last=-1"),
    ("stage0", "train.lr=nan", "train.lr=nan"),
    ("stage0", "data.val_fraction=1.5", "data.val_fraction=1.5"),
    ("stage1", "train.amp=maybe", "train.amp='maybe'"),
    ("stage1", "train.lr_scaling=cubic", "train.lr_scaling='cubic'"),
    ("stage1", "train.lr_reference_batch=0", "train.lr_reference_batch=0"),
    ("collect", "episodes_per_job=0", "episodes_per_job=0"),
    ("collect", "num_workers=0", "num_workers=0"),
    ("collect", "task.demos_per_task=0", "task.demos_per_task=0"),
    ("collect", "noise=-1", "noise=-1"),
    ("eval", "episodes_per_task=-1", "episodes_per_task=-1"),
    ("eval", "episodes_per_task=0", "episodes_per_task=0"),
    ("eval", "workers.timeout_s=0", "workers.timeout_s=0"),
    ("rl", "rl.iterations=0", "rl.iterations=0"),
    ("rl", "rl.rollouts_per_group=0", "rl.rollouts_per_group=0"),
    ("rl", "rl.advantage=ppo2", "rl.advantage='ppo2'"),
    ("rl", "rl.compile_ahead=sometimes", "rl.compile_ahead='sometimes'"),
    ("rl", "rl.compile_ahead_wait_s=0", "rl.compile_ahead_wait_s=0"),
    ("rl", "rl.task_weighting_floor=2", "rl.task_weighting_floor=2"),
    ("rl", "placement.rollout_gpus=1.5", "a share of one GPU (at most 1) or a whole number"),
    ("rl", "compile_cache=/nowhere/compile_cache.bin", "compile_cache='/nowhere/compile_cache.bin' is out of range: "
                                                       "not an existing file"),
    ("stage1", "compile_cache=/nowhere/compile_cache.bin", "not an existing file"),
    ("eval", "workers.pipeline_stages=0", "workers.pipeline_stages=0"),
    ("rl", "workers.decisions=sometimes", "workers.decisions='sometimes'"),
    ("quickstart", "stage1.steps=0", "stage1.steps=0"),
    ("world_model_head", "steps=0", "steps=0"),
    ("world_model_eval", "denoise_steps=0", "denoise_steps=0"),
    ("world_model_head", "lr=nan", "lr=nan"),
    ("collect", "task.task_names=[]", "an empty list names no task"),
    ("stage0", "task.task_names=[button-press-v3,drawer-close-v3,button-press-v3]", "button-press-v3 listed more"),
    ("eval", "task_names=[drawer-close-v3,drawer-close-v3]", "drawer-close-v3 listed more than once"),
])
def test_out_of_range_values_are_refused_with_the_key(job, override, fragment):
    from ript.config import compose

    extra = ["checkpoint=somewhere"] if job in ("eval", "rl", "world_model_eval") else []
    with pytest.raises(RiptError, match="out of range") as e:
        compose(job, [override, *extra])
    assert fragment in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("job", ["rl", "eval"])
def test_a_world_models_denoising_steps_out_of_range_are_refused_with_the_key(job):
    from ript.config import compose

    with pytest.raises(RiptError, match="out of range") as e:
        compose(job, ["environment=world_model", "environment.denoise_steps=0", "checkpoint=somewhere"])
    assert "environment.denoise_steps=0" in str(e.value) and "\n" not in str(e.value)


def test_invalid_value_through_the_cli_creates_nothing(tmp_path):
    assert_one_line_error(ript_here("stage0", "train.steps=0", f"run_dir={tmp_path}/run"), "train.steps=0",
                          "greater than 0")
    assert not (tmp_path / "run").exists()


def test_keep_last_keeps_the_newest_and_never_the_one_last_points_to(tmp_path):
    from ript.utils.checkpoint import resolve_checkpoint_dir, save_checkpoint

    model = torch.nn.Linear(2, 2)
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model, {}, keep_last=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["0000002", "0000003", "last"]
    save_checkpoint(tmp_path, 4, model, {}, keep_last=1)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["0000004", "last"]
    assert resolve_checkpoint_dir(tmp_path).name == "0000004"
    with pytest.raises(RiptError, match="keep_last=-1"):
        save_checkpoint(tmp_path, 5, model, {}, keep_last=-1)
    assert resolve_checkpoint_dir(tmp_path).name == "0000004"  # the refused save lost nothing
    save_checkpoint(tmp_path, 5, model, {}, keep_last=0)  # 0: keep every checkpoint
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["0000004", "0000005", "last"]


def test_the_best_checkpoint_is_never_pruned_and_its_score_survives_a_resume(tmp_path):
    from ript.evaluation.results import evaluation_dir
    from ript.utils.checkpoint import mark_best, save_checkpoint
    from ript.utils.trainer import best_score

    def best_evaluation(run_dir):  # (success rate, step) of checkpoints/best, as stage 1 reads it
        return best_score(run_dir, lambda step: evaluation_dir(run_dir, step) / "results.json")

    model = torch.nn.Linear(2, 2)
    assert best_evaluation(tmp_path) is None
    save_checkpoint(tmp_path, 1, model, {}, keep_last=1)
    (tmp_path / "eval" / "step0000001").mkdir(parents=True)
    (tmp_path / "eval" / "step0000001" / "results.json").write_text(json.dumps({"success_rate": 0.75}))
    mark_best(tmp_path, 1)
    for step in (2, 3):
        save_checkpoint(tmp_path, step, model, {}, keep_last=1)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["0000001", "0000003", "best", "last"]
    assert best_evaluation(tmp_path) == (0.75, 1)
    with pytest.raises(RiptError, match="step 2"):
        mark_best(tmp_path, 2)  # pruned: not a checkpoint any more
    (tmp_path / "eval" / "step0000001" / "results.json").write_text("{")
    with pytest.raises(RiptError, match="results.json"):
        best_evaluation(tmp_path)


def test_failed_start_leaves_no_folder_and_a_stub_resumes(tiny_data, tmp_path):
    run = tmp_path / "run"
    bad = task_overrides(tmp_path / "missing") + ["algo=quest_small", f"run_dir={run}"]
    assert_one_line_error(ript_here("stage0", *bad), "does not exist")
    assert not run.exists()
    # what a start killed before its first checkpoint leaves: resume=true starts it over, a fresh start refuses
    run.mkdir()
    (run / "config.json").write_text("{}")
    (run / "tb").mkdir()
    overrides = train_overrides(tiny_data, run, 2)
    assert_one_line_error(ript_here("stage0", *overrides), "already exists", "resume=true")
    code, _, err = ript_here("stage0", *overrides, "resume=true")
    assert code == 0, err
    assert (run / "checkpoints" / "last" / "model.safetensors").is_file()


def test_run_dir_that_is_a_file(tiny_data, tmp_path):
    (tmp_path / "file").write_text("x")
    assert_one_line_error(ript_here("stage0", *train_overrides(tiny_data, tmp_path / "file", 2)), "is a file")


def test_resume_refuses_changes_that_alter_the_result(stage0_run, tiny_data, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(stage0_run, run)
    base = train_overrides(tiny_data, run, 4) + ["resume=true"]
    assert_one_line_error(ript_here("stage0", *base[:-1], "train.batch_size=8", "seed=3", "resume=true"),
                          "seed=0", "seed=3", "1 more: train.batch_size",
                          "resume_allow_changes=[seed,train.batch_size]")
    # run-control keys may change; an allowed key is accepted
    code, _, err = ript_here("stage0", *base, "train.stop_after_minutes=5", "train.batch_size=8",
                             "resume_allow_changes=[train.batch_size]")
    assert code == 0, err


def test_eval_output_stays_in_its_run_and_is_not_replaced(stage1_run, tmp_path):
    copy = tmp_path / "copied_checkpoint"
    shutil.copytree(stage1_run / "checkpoints" / "last", copy)
    args = ["episodes_per_task=1", "num_workers=1", "max_episode_steps=8", "n_videos=0"]
    assert_one_line_error(ript_here("eval", f"checkpoint={copy}", *args), "not inside a run folder", "out_dir=")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copied_checkpoint"]  # nothing written beside it
    out = tmp_path / "out"
    code, _, err = ript_here("eval", f"checkpoint={copy}", f"out_dir={out}", *args)
    assert code == 0, err
    first = (out / "results.json").read_text()
    assert_one_line_error(ript_here("eval", f"checkpoint={copy}", f"out_dir={out}", "seed=1", *args),
                          "results.json exists", "overwrite=true")
    assert (out / "results.json").read_text() == first
    code, _, err = ript_here("eval", f"checkpoint={copy}", f"out_dir={out}", "seed=1", "overwrite=true", *args)
    assert code == 0, err
    assert (json.loads((out / "results.json").read_text())["episodes"][0]["seed"]
            != json.loads(first)["episodes"][0]["seed"])


def test_language_cache_has_the_default_file_mode(tmp_path):
    import os

    from ript.data.language import current_umask, embed_instructions

    cache = tmp_path / "lang.safetensors"
    embed_instructions(["open the drawer"], "minilm", cache)
    assert cache.stat().st_mode & 0o777 == 0o666 & ~current_umask()
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
