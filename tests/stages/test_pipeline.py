"""The staged pipeline end to end on the real simulator: stage 0 -> stage 1 -> eval, finetune, resume."""

import json
import shutil

import numpy as np
import pytest
import torch

from ript.config import compose
from ript.errors import RiptError
from ript.model_loader import load_model
from ript.stages import evaluate, stage0, stage1
from tests.helpers.cli import TASKS, stage1_overrides, train_overrides
from tests.helpers.weights import assert_same_weights, weights


def test_stage0_checkpoint_layout(stage0_run):
    ckpt = stage0_run / "checkpoints"
    assert (ckpt / "last").resolve().name == "0000004"
    assert sorted(p.name for p in ckpt.iterdir() if p.name.isdigit()) == ["0000002", "0000004"]
    config = json.loads((ckpt / "last" / "config.json").read_text())
    assert config["stage"] == "stage0" and config["model_name"] == "action_autoencoder"
    assert config["metadata"]["env_args"]["render"]["image_size"] == 32
    state = torch.load(ckpt / "last" / "training_state.pt", weights_only=True)
    assert (state["step"] == 4 and "optimizer" in state and "rng" in state["ranks"][0]
            and "data_rng" in state["ranks"][0])
    assert (stage0_run / "tb").is_dir()


def test_stage_resume_matches_uninterrupted_run(tiny_data, stage0_run, stage1_run, tmp_path):
    # stage 0: 2 steps, then resume to 4 == the fixture's uninterrupted 4 steps
    part = tmp_path / "s0"
    stage0.run(compose("stage0", train_overrides(tiny_data, part, 4) + ["train.stop_after_minutes=0"]))
    assert (part / "checkpoints" / "last").resolve().name == "0000001"
    stage0.run(compose("stage0", train_overrides(tiny_data, part, 4) + ["resume=true"]))
    assert_same_weights(weights(part), weights(stage0_run))
    # stage 1 likewise
    part1 = tmp_path / "s1"
    s1 = stage1_overrides(tiny_data, part1, stage0_run)  # with an evaluation, which must not disturb training
    stage1.run(compose("stage1", s1 + ["train.stop_after_minutes=0"]))
    stage1.run(compose("stage1", s1 + ["resume=true"]))
    assert_same_weights(weights(part1), weights(stage1_run))
    best = (stage1_run / "checkpoints" / "best").resolve().name
    assert (part1 / "checkpoints" / "best").resolve().name == best  # the same evaluations, the same best step


def test_stage1_resume_after_a_validation_pass_with_autoencoder_dropout(tiny_data, tmp_path):
    # The H100 LIBERO run's resumed stage 1 diverged from the uninterrupted one: validation switched the model
    # back to training mode, dropout included in the frozen autoencoder that makes the target tokens, while a
    # resumed process trained with it off. Stop right after a validation pass, resume, compare.
    ae = tmp_path / "s0"
    stage0.run(compose("stage0", train_overrides(tiny_data, ae, 2) + ["algo.autoencoder.dropout=0.3"]))
    s1 = lambda run: train_overrides(tiny_data, run, 3) + [f"stage0_checkpoint={ae}", "train.val_every=1"]  # noqa: E731
    stage1.run(compose("stage1", s1(tmp_path / "whole")))
    stage1.run(compose("stage1", s1(tmp_path / "part") + ["train.stop_after_minutes=0"]))
    assert (tmp_path / "part" / "checkpoints" / "last").resolve().name == "0000001"
    stage1.run(compose("stage1", s1(tmp_path / "part") + ["resume=true"]))
    assert_same_weights(weights(tmp_path / "part"), weights(tmp_path / "whole"))


def test_existing_run_dir_is_refused_without_resume(tiny_data, stage0_run):
    before = weights(stage0_run)
    with pytest.raises(RiptError, match="already exists; pass resume=true"):
        stage0.run(compose("stage0", train_overrides(tiny_data, stage0_run, 4)))
    assert_same_weights(weights(stage0_run), before)


def test_model_loader_refuses_wrong_stage(stage0_run, stage1_run, tiny_data, tmp_path):
    with pytest.raises(RiptError, match="from stage 'stage1'.*stage0 checkpoint is needed"):
        load_model(stage1_run, expect_stage="stage0")
    with pytest.raises(RiptError, match="from stage 'stage1'.*stage0 checkpoint is needed"):
        stage1.run(compose("stage1", train_overrides(tiny_data, tmp_path / "x", 2) +
                           [f"stage0_checkpoint={stage1_run}"]))
    model, config = load_model(stage1_run, expect_stage="stage1")
    assert model.task_names == TASKS and config["metadata"]["stage0_checkpoint"]


def test_stage1_evaluates_during_training_and_keeps_the_best_step(stage1_run):
    rates = {}
    for step in (2, 4):
        results = json.loads((stage1_run / "eval" / f"step{step:07d}" / "results.json").read_text())
        assert results["per_task"].keys() == set(TASKS)
        rates[step] = results["success_rate"]
    assert (stage1_run / "tb").is_dir()
    best = max(rates, key=lambda s: (rates[s], -s))  # ties: the earlier step
    assert (stage1_run / "checkpoints" / "best").resolve().name == f"{best:07d}"
    _, config = load_model(stage1_run / "checkpoints" / "best", expect_stage="stage1")
    assert config["step"] == best


def test_stage1_with_learned_task_ids(tiny_data, stage0_run, tmp_path):
    stage1.run(compose("stage1", train_overrides(tiny_data, tmp_path / "ids", 2) +
                       [f"stage0_checkpoint={stage0_run}", "lang.encoder=task_id"]))
    model, _ = load_model(tmp_path / "ids")
    assert model.task_table.weight.shape[0] == 2 and not hasattr(model, "task_embeddings")


def test_stage1_stores_language_embeddings(stage1_run, tiny_data):
    model, _ = load_model(stage1_run)
    emb = model.task_embeddings
    assert emb.shape == (2, 384) and torch.allclose(emb.norm(dim=-1), torch.ones(2), atol=1e-4)
    assert (tiny_data / "lang_cache.safetensors").is_file()


def test_eval_writes_results_and_videos(stage1_run, tmp_path):
    out = tmp_path / "eval"
    results = evaluate.run(compose("eval", [f"checkpoint={stage1_run}", "episodes_per_task=2", "num_workers=2",
                                            "max_episode_steps=24", f"out_dir={out}", "n_videos=1"]))
    saved = json.loads((out / "results.json").read_text())
    assert saved["per_task"].keys() == set(TASKS)
    png = (out / "success.png").read_bytes()  # the per-task success bars, readable like the other outputs
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 2000
    assert (out / "success.png").stat().st_mode & 0o777 == (out / "results.json").stat().st_mode & 0o777
    # each task's first view (its first episode's first frame, both cameras), drawn from the run's own frames
    assert list(results["first_frames"]) == sorted(TASKS)
    assert all(f.shape == (32, 64, 3) and f.dtype == np.uint8 and f.std() > 0 for f in results["first_frames"].values())
    assert (out / "first_frames.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and "first_frames" not in saved
    assert all(t["episodes"] == 2 for t in saved["per_task"].values())
    assert all(e["length"] <= 24 for e in saved["episodes"])
    # the overall rate is the mean of the per-task rates, each counted from its episodes
    for task, t in saved["per_task"].items():
        eps = [e for e in saved["episodes"] if e["task"] == task]
        assert t["successes"] == sum(e["success"] for e in eps) and t["success_rate"] == t["successes"] / len(eps)
    assert results["success_rate"] == sum(t["success_rate"] for t in saved["per_task"].values()) / len(TASKS)
    assert len(list((out / "videos").glob("*.mp4"))) == 2
    # fixed seeds: the same checkpoint and config give the same episodes
    again = evaluate.run(compose("eval", [f"checkpoint={stage1_run}", "episodes_per_task=2", "num_workers=2",
                                          "max_episode_steps=24", f"out_dir={tmp_path / 'again'}", "n_videos=0"]))
    assert again["episodes"] == saved["episodes"]


def test_finetune_on_a_new_task_with_decoder_l1(stage1_run, tiny_data, tmp_path):
    run_dir = tmp_path / "ft"
    stage1.run_finetune(compose("finetune", train_overrides(tiny_data, run_dir, 2) + [
        f"checkpoint={stage1_run}", "task=metaworld_quick", "task.task_names=[drawer-close-v3]",
        "task.demos_per_task=2", "decoder_l1_weight=0.5", "data.val_fraction=0"]))
    model, config = load_model(run_dir, expect_stage="finetune")
    base, _ = load_model(stage1_run)
    assert model.task_names == ["drawer-close-v3"] and config["stage"] == "finetune"
    assert not torch.equal(model.autoencoder.out.weight, base.autoencoder.out.weight)  # decoder trained
    assert torch.equal(model.autoencoder.in_proj.weight, base.autoencoder.in_proj.weight)  # encoder frozen


def test_quickstart_passes_algo_overrides_to_every_stage():
    from ript.quickstart import stage_configs

    configs = stage_configs(compose("quickstart", ["algo.prior.n_layer=4", "algo.autoencoder.dim=32"]))
    for job in ("stage0", "stage1"):
        assert configs[job].algo.name == "quest_small"
        assert configs[job].algo.prior.n_layer == 4 and configs[job].algo.autoencoder.dim == 32


def test_finetune_refuses_algo_settings_it_would_not_apply(stage1_run, tiny_data, tmp_path):
    """Fine-tuning keeps the base's model and replanning: another architecture or action horizon would be
    recorded in the checkpoint while the base's is trained and used."""
    from tests.helpers.cli import assert_one_line_error, ript_here

    run_dir = tmp_path / "ft"
    args = [*train_overrides(tiny_data, run_dir, 2), f"checkpoint={stage1_run}", "task.task_names=[drawer-close-v3]"]
    assert_one_line_error(ript_here("finetune", *args, "algo=quest"),
                          "algo.name='quest' differs from the base checkpoint's 'quest_small'", "algo=quest_small")
    for override, fragment in [("algo.prior.n_layer=4", "algo.prior.n_layer=4 differs from the base checkpoint's 2"),
                               ("algo.action_horizon=2", "algo.action_horizon=2 differs from the base checkpoint's 8")]:
        with pytest.raises(RiptError, match="fine-tuning keeps the base's architecture") as e:
            stage1.run_finetune(compose("finetune", [*args, override]))
        assert fragment in str(e.value)
    assert not run_dir.exists()


@pytest.mark.parametrize("state,fragment", [
    ({"phases": {"collect": {"seconds": 3.0, "gpus": 1}}}, "phases.collect.overrides is missing"),
    ([{"phases": {}}], "not a protocol record"),
    ({"finished": {}}, "not a protocol record"),
    ({"phases": {"collect": {"overrides": [], "seconds": "3 min", "gpus": 1}}}, "phases.collect.seconds='3 min'"),
    ({"phases": {}, "cut": {"stage0": "12"}}, "'cut'"),
])
def test_a_hand_edited_protocol_record_is_one_line(tmp_path, state, fragment):
    from ript.stages.protocol_state import read_state

    (tmp_path / "protocol.json").write_text(json.dumps(state))
    with pytest.raises(RiptError, match="move it away") as e:
        read_state(tmp_path)
    assert fragment in str(e.value) and str(tmp_path / "protocol.json") in str(e.value)


def test_a_protocol_over_a_record_without_overrides_stops_in_one_line(tmp_path):
    from tests.helpers.cli import assert_one_line_error, ript_here

    (tmp_path / "protocol.json").write_text(json.dumps({"phases": {"collect": {"seconds": 3.0, "gpus": 1}}}))
    assert_one_line_error(ript_here("protocol", "ml45_multitask", f"run_root={tmp_path}"), "protocol.json",
                          "phases.collect.overrides")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["protocol.json"]


def test_a_training_split_smaller_than_a_batch_is_one_line(tiny_data, stage0_run, tmp_path):
    """Demos of one step each: fewer samples than train.batch_size, which the image augmentation drew offsets
    for (an IndexError before)."""
    import h5py

    from tests.helpers.cli import assert_one_line_error, ript_here

    data = tmp_path / "short"
    data.mkdir()
    for task in TASKS:
        with h5py.File(tiny_data / f"{task}.hdf5") as src, h5py.File(data / f"{task}.hdf5", "w") as dst:
            dst.create_group("data").attrs.update(src["data"].attrs)
            for name, demo in src["data"].items():
                def first_step(path, obj, name=name):
                    if isinstance(obj, h5py.Dataset):
                        dst.create_dataset(f"data/{name}/{path}", data=obj[:1])

                demo.visititems(first_step)
                dst[f"data/{name}"].attrs.update(demo.attrs)
    run_dir = tmp_path / "s1"
    assert_one_line_error(ript_here("stage1", *train_overrides(data, run_dir, 2), f"stage0_checkpoint={stage0_run}"),
                          "train.batch_size=16 is larger than the training split: 4 samples from 4 demos",
                          "shorter than two steps")
    assert not run_dir.exists()


def test_resume_over_changed_data_files_is_refused(tiny_data, tmp_path):
    """The config is the same, the data is not (a demo fewer in one file): resuming would go on training on
    other data without a word."""
    import h5py

    from tests.helpers.cli import assert_one_line_error, ript_here

    data, run_dir = tmp_path / "data", tmp_path / "s0"
    shutil.copytree(tiny_data, data)
    stage0.run(compose("stage0", train_overrides(data, run_dir, 2)))
    with h5py.File(data / "drawer-close-v3.hdf5", "a") as f:
        del f["data/demo_2"]
    resume = [*train_overrides(data, run_dir, 4), "resume=true", "resume_allow_changes=[train.steps]"]
    assert_one_line_error(ript_here("stage0", *resume), "drawer-close-v3.hdf5 with 2 demos", "now has 1 demos",
                          "resume_allow_changes=[data]")
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["0000002", "last"]


def test_resume_over_changed_episode_files_named_as_the_demos_is_refused(tiny_data, tmp_path):
    """A world model's recorded episodes (data.extra_dirs) are files named as the demos' of the same tasks: a
    change in the demos is named in one line too, not hidden behind the unchanged episodes file of that name."""
    import h5py

    from ript.stages import world_model
    from tests.helpers.cli import assert_one_line_error, ript_here, world_model_overrides

    data, episodes, run_dir = tmp_path / "data", tmp_path / "episodes", tmp_path / "wm"
    shutil.copytree(tiny_data, data)
    shutil.copytree(tiny_data, episodes)
    train = [*world_model_overrides(data, run_dir, 2), f"data.extra_dirs=[{episodes}]"]
    world_model.run(compose("world_model", train))
    with h5py.File(data / "drawer-close-v3.hdf5", "a") as f:
        del f["data/demo_2"]
    resume = [*train, "train.steps=4", "resume=true", "resume_allow_changes=[train.steps]"]
    assert_one_line_error(ript_here("world-model", *resume), "drawer-close-v3.hdf5 with 2 demos", "now has 1 demos",
                          "resume_allow_changes=[data]")
