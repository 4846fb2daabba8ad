"""The training scaffold every loop shares: cadence, metric sums by name, checkpoints, resume, best, time limit."""

import json

import pytest
import torch

from ript.errors import RiptError
from ript.utils.checkpoint import load_weights, resolve_checkpoint_dir
from ript.utils.distributed import DistInfo
from ript.utils.trainer import RunSettings, Timer, TrainingRun, best_score, due, sum_by_name


def test_periodic_actions_fall_on_multiples_and_the_last_step():
    assert [d for d in range(1, 8) if due(3, d, 7)] == [3, 6, 7]
    assert not any(due(0, d, 7) for d in range(1, 8))  # 0: never


def test_named_sums_keep_their_names_and_values_alone():
    sums = {"episodes": 4, "successes": 3, "returns_sum": 1.5, "episodes/reach-v3": 2}
    assert sum_by_name(sums, DistInfo()) == sums
    assert list(sum_by_name(sums, DistInfo())) == list(sums)


def test_phases_are_timed_by_name_and_may_nest():
    timer = Timer()
    with timer("train"), timer("train_prepare"):
        pass
    assert set(timer.seconds) == {"train", "train_prepare"}
    assert timer.seconds["train"] >= timer.seconds["train_prepare"] >= 0


def make_run(tmp_path, model, resume_from=None, minutes=None):
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    return TrainingRun(RunSettings("test", tmp_path, resume_from, 2, minutes), DistInfo(), opt, sched)


def test_a_saved_run_resumes_with_its_weights_step_streams_and_logger_id(tmp_path):
    model = torch.nn.Linear(3, 2)
    run = make_run(tmp_path, model)
    assert run.resume(lambda ckpt: pytest.fail("nothing to resume")) is None
    run.open_logger({})
    model(torch.ones(1, 3)).sum().backward()
    run.opt.step()
    run.save(3, model, {"stage": "test"}, {"data_rng": torch.Generator().manual_seed(5).get_state()})
    run.close()

    again = torch.nn.Linear(3, 2)
    resumed = make_run(tmp_path, again, resolve_checkpoint_dir(tmp_path))
    streams = resumed.resume(lambda ckpt: again.load_state_dict(load_weights(ckpt)))
    assert resumed.start == 3 and resumed.run_id == run.logger.run_id
    assert torch.equal(streams["data_rng"], torch.Generator().manual_seed(5).get_state())
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    assert resumed.opt.state_dict()["state"][0]["step"] == 1


def test_a_resumed_optimizer_keeps_its_moments_in_the_strides_of_channels_last_weights(tmp_path):
    # checkpoints keep the moments contiguous; CUDA's fused Adam refuses moments laid out unlike their weights
    def conv():
        return torch.nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)

    model = conv()
    run = make_run(tmp_path, model)
    run.open_logger({})
    model(torch.ones(1, 3, 5, 5)).sum().backward()
    run.opt.step()
    run.save(1, model, {"stage": "test"}, {})
    run.close()

    again = conv()
    resumed = make_run(tmp_path, again, resolve_checkpoint_dir(tmp_path))
    resumed.resume(lambda ckpt: again.load_state_dict(load_weights(ckpt)))
    moments = resumed.opt.state[again.weight]
    assert moments["exp_avg"].stride() == moments["exp_avg_sq"].stride() == again.weight.stride()
    assert torch.equal(moments["exp_avg"], run.opt.state[model.weight]["exp_avg"])


def test_the_best_step_is_kept_by_score_and_ties_keep_the_earlier(tmp_path):
    model = torch.nn.Linear(2, 2)
    run = make_run(tmp_path, model)
    run.open_logger({})

    def results(step):
        return tmp_path / "eval" / f"{step}.json"

    for step, score in ((1, 0.5), (2, 0.5), (3, 0.75), (4, 0.25)):
        run.save(step, model, {}, {})
        results(step).parent.mkdir(exist_ok=True)
        results(step).write_text(json.dumps({"success_rate": score}))
        run.keep_best(step, score, results)
    assert best_score(tmp_path, results) == (0.75, 3)
    results(3).write_text("{")
    with pytest.raises(RiptError, match="3.json"):
        best_score(tmp_path, results)
    run.close()


def test_the_time_limit(tmp_path):
    model = torch.nn.Linear(2, 2)
    assert make_run(tmp_path, model, minutes=0).out_of_time()
    assert not make_run(tmp_path, model, minutes=None).out_of_time()
    assert not make_run(tmp_path, model, minutes=60).out_of_time()


def test_the_peak_learning_rate_follows_the_batch_by_the_chosen_rule():
    from omegaconf import OmegaConf

    from ript.utils.training import make_optimizer, peak_lr

    def train(rule, batch):
        return OmegaConf.create({"lr": 3e-4, "lr_scaling": rule, "lr_reference_batch": 256, "batch_size": batch,
                                 "weight_decay": 0.0, "warmup_steps": 0})

    assert peak_lr(train("none", 1024)) == pytest.approx(3e-4)
    assert peak_lr(train("sqrt", 1024)) == pytest.approx(6e-4)
    assert peak_lr(train("linear", 1024)) == pytest.approx(12e-4)
    assert peak_lr(train("linear", 64)) == pytest.approx(0.75e-4)
    assert peak_lr(train("sqrt", 256)) == pytest.approx(3e-4)  # the reference batch keeps train.lr
    opt, _ = make_optimizer([torch.nn.Parameter(torch.zeros(2))], train("sqrt", 1024), 10, "cpu")
    assert opt.param_groups[0]["lr"] == pytest.approx(6e-4)  # the optimiser starts at the scaled peak


def test_a_run_made_before_a_setting_existed_resumes_at_the_value_that_reproduces_it():
    from ript.utils.run_dir import changed_keys

    before = {"train": {"lr": 1e-3, "batch_size": 64}}
    now = {"train": {"lr": 1e-3, "batch_size": 64, "lr_scaling": "none", "lr_reference_batch": 256}}
    assert changed_keys(before, now, ()) == []
    scaled = {"train": {**now["train"], "lr_scaling": "linear"}}
    assert [k for k, _, _ in changed_keys(before, scaled, ())] == ["train.lr_reference_batch", "train.lr_scaling"]
    stored_with_it = {"train": {**now["train"], "lr_reference_batch": 64}}  # a run that has the setting: compared
    assert [k for k, _, _ in changed_keys(stored_with_it, now, ())] == ["train.lr_reference_batch"]


def test_a_checkpoint_holds_the_state_at_its_save_while_training_goes_on(tmp_path):
    """Checkpoints are written on a thread of their own: what a save wrote is the state when it was called, though
    the weights, the optimiser and the streams change right after; the extra files are written at the call too."""
    model = torch.nn.Linear(3, 2)
    run = make_run(tmp_path, model)
    run.open_logger({})
    model(torch.ones(1, 3)).sum().backward()
    run.opt.step()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    streams = {"sampler": {"counts": [1, 2]}}

    def extra(folder, whole):
        (folder / "extra.txt").write_text(f"{float(model.bias[0]):.6f}")

    run.save(1, model, {"stage": "test"}, streams, write_extra=extra)
    bias_at_save = f"{float(model.bias[0]):.6f}"
    with torch.no_grad():
        model.weight.add_(1.0)
        model.bias.add_(1.0)
    run.opt.state[model.weight]["exp_avg"].add_(1.0)
    streams["sampler"]["counts"].append(3)
    run.close()
    ckpt = resolve_checkpoint_dir(tmp_path)
    written = load_weights(ckpt)
    assert all(torch.equal(written[k], saved[k]) for k in saved)
    state = torch.load(ckpt / "training_state.pt", weights_only=True)
    assert state["ranks"][0]["sampler"]["counts"] == [1, 2]
    assert not torch.equal(state["optimizer"]["state"][0]["exp_avg"], run.opt.state[model.weight]["exp_avg"])
    assert (ckpt / "extra.txt").read_text() == bias_at_save
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]  # nothing left staged


def test_a_host_copy_shares_no_memory_with_what_it_copied():
    from ript.utils.checkpoint import host_copy

    live = {"w": torch.ones(2, 3).t(), "nested": [torch.zeros(2), {"n": 1, "xs": [1]}], "pair": (torch.ones(1), "a")}
    snap = host_copy(live)
    live["w"].add_(1)
    live["nested"][0].add_(1)
    live["nested"][1]["xs"].append(2)
    live["pair"][0].add_(1)
    assert torch.equal(snap["w"], torch.ones(3, 2)) and snap["w"].is_contiguous()
    assert torch.equal(snap["nested"][0], torch.zeros(2)) and snap["nested"][1] == {"n": 1, "xs": [1]}
    assert torch.equal(snap["pair"][0], torch.ones(1)) and snap["pair"][1] == "a" and isinstance(snap["pair"], tuple)


def test_weight_average_follows_the_warmed_up_decay_and_swaps_back_exactly():
    from ript.utils.training import WeightAverage

    model = torch.nn.Linear(3, 2)
    model.bias.requires_grad_(False)  # only trained weights are averaged
    average = WeightAverage(model, decay=0.9)
    expected = model.weight.detach().clone()
    for step in range(3):
        with torch.no_grad():
            model.weight.add_(1.0)
            model.bias.add_(1.0)
        average.update(step)
        decay = min(0.9, (1 + step) / (10 + step))
        expected = decay * expected + (1 - decay) * model.weight.detach()
    assert torch.allclose(average.average[0], expected)
    trained = model.weight.detach().clone()
    with average.swapped_in():
        assert torch.equal(model.weight, average.average[0])
    assert torch.equal(model.weight, trained)
    with pytest.raises(RiptError, match="no trained weight 'weight'"):
        average.restore({"bias": model.bias.detach()}, "ckpt")


def test_a_config_recorded_before_a_setting_was_added_gets_the_value_it_ran_with():
    """An older world model's recorded config, trained again (the two-phase loop), lacks the settings added since:
    each is filled with the value that computes what the run computed, only where its section is there."""
    from ript.utils.run_dir import with_added_settings

    recorded = {"algo": {"chunk": 4, "model": {"width": 8, "output": "warp"}}, "train": {"steps": 2}}
    filled = with_added_settings(recorded)
    assert filled["algo"]["model"] == {"width": 8, "output": "warp", "denoise_steps": 3, "cond_noise": 0.0,
                                       "state_head": "bottleneck", "feed_back": "regressed"}
    assert filled["algo"]["state_steps"] == 0 and filled["train"]["lr_scaling"] == "none"
    assert "rl" not in filled and "environment" not in filled  # no section of its own to fill
    assert recorded["algo"]["model"] == {"width": 8, "output": "warp"}  # the recorded config itself is left alone
