"""``ript protocol``: every phase as its own job on the real simulator, a time-limited phase continued by running
the same command again, finished phases skipped, and the per-task table of both evaluations."""

from __future__ import annotations

import json
import shutil

import pytest
import typer

from ript import cli
from ript.config import compose, override
from ript.errors import RiptError
from ript.stages import protocol, protocol_results, protocol_state
from tests.helpers.cli import assert_one_line_error, ript_here, task_overrides

EVAL = "{episodes_per_task: 2, num_workers: 1, max_episode_steps: 16, n_videos: 0}"
TRAIN = "steps: 4, batch_size: 16, warmup_steps: 2, val_every: 2, save_every: 2, log_every: 1"


def protocol_overrides(data_dir, root, stage1_extra: str = "") -> list[str]:
    """The ML45 protocol's phases, shrunk to seconds on a CPU: two tasks, four training steps, two episodes."""
    return task_overrides(data_dir) + [
        "protocol=ml45_multitask", "algo=quest_small", override("run_root", root), "gpus=1",
        "++phases.collect={episodes_per_job: 2, num_workers: 2}",
        f"++phases.stage0={{progress: false, train: {{{TRAIN}}}, data: {{val_fraction: 0.34}}}}",
        f"++phases.stage1={{progress: false, train: {{{TRAIN}{stage1_extra}}}, data: {{val_fraction: 0.34}}}}",
        f"++phases.eval={EVAL}",
        "++phases.rl={task_names: [drawer-close-v3], sampling: {temperature: 3.0}, eval: {every: 0}, "
        "rl: {iterations: 1, "
        "groups_per_iteration: 2, rollouts_per_group: 2, max_episode_steps: 36, num_workers: 2, "
        "max_sampling_rounds: 2, epochs: 2, minibatches: 2, lr: 1e-3}}",
        f"++phases.eval_rl={EVAL[:-1]}, sampling: {{greedy: true}}}}",  # as LIBERO-Spatial's: RL's mode
    ]


def test_a_protocol_runs_every_phase_continues_a_cut_one_and_skips_finished_ones(tiny_data, tmp_path, capsys):
    # a run root and a data folder with non-ASCII characters and spaces: every phase is its own ``ript`` process
    root, data = tmp_path / "prötocol ü 1", tmp_path / "dätä 2"
    shutil.copytree(tiny_data, data)
    overrides = protocol_overrides(data, root)
    cut = protocol.run(compose("protocol", protocol_overrides(data, root, ", stop_after_minutes: 0")))
    assert cut["stopped"] == "stage1" and cut["step"] < 4  # its own time limit: nothing after it ran
    assert not (root / "eval").exists()
    state = json.loads((root / "protocol.json").read_text())
    assert list(state["phases"]) == ["collect", "stage0"] and "stage1" in state["cut"]

    results = protocol.run(compose("protocol", overrides))  # the same command again
    state = json.loads((root / "protocol.json").read_text())
    assert list(state["phases"]) == list(protocol.PHASES[:3]) + ["eval", "rl", "eval_rl"]
    assert state["phases"]["stage1"]["step"] == 4 and state["phases"]["rl"]["step"] == 1
    assert results["evaluations"]["eval"]["episodes"] == 4 and results["evaluations"]["eval_rl"]["episodes"] == 4
    for name in ("eval", "eval_rl"):  # each evaluation is the one its job wrote, of the checkpoint it names
        written = json.loads((root / name / "results.json").read_text())
        assert results["evaluations"][name]["success_rate"] == written["success_rate"]
    assert results["evaluations"]["eval_rl"]["checkpoint"].startswith(str(root / "rl"))
    assert json.loads((root / "results.json").read_text()) == results
    assert sorted(p.name for p in root.parent.iterdir()) == ["dätä 2", "prötocol ü 1"]  # no escaped twins
    table = capsys.readouterr().out
    assert "button-press-v3" in table and "after RL" in table and "stage1" in table
    decoding = next(line for line in table.splitlines() if line.startswith("decoding")).split()
    assert decoding[1:] == ["T1", "k10", "h8", "greedy", "h8"], decoding  # each evaluation's own

    again = protocol.run(compose("protocol", overrides))  # nothing left to run
    assert again == results
    assert json.loads((root / "protocol.json").read_text()) == state
    # on a host of another size, without progress bars: how the phases are driven, not what they compute
    other_host = overrides + ["phases.collect.num_workers=1", "phases.collect.episodes_per_job=1",
                              "phases.eval.num_workers=3",
                              "phases.rl.rl.num_workers=1", "phases.stage0.progress=true"]
    assert protocol.run(compose("protocol", other_host)) == results
    more = overrides + ["phases.rl.rl.iterations=2"]
    _check_rl_goes_on_when_asked_for_more_iterations(root, more, results, state)
    _check_messages_about_finished_phases(root, more)


def _check_rl_goes_on_when_asked_for_more_iterations(root, more, results, state):
    """A finished RL phase asked for more iterations goes on from its last one and is evaluated again; the earlier
    evaluation after RL is kept beside it."""
    extended = protocol.run(compose("protocol", more))
    now = json.loads((root / "protocol.json").read_text())
    assert list(now["phases"]) == list(state["phases"]) and now["phases"]["rl"]["step"] == 2
    assert now["phases"]["rl"]["seconds"] > state["phases"]["rl"]["seconds"]  # its earlier time counts
    assert now["phases"]["eval"] == state["phases"]["eval"]
    history = json.loads((root / "rl" / "rl_history.json").read_text())
    assert [h["iteration"] for h in history] == [1, 2]
    kept = json.loads((root / "eval_rl_iteration1" / "results.json").read_text())
    assert kept["success_rate"] == results["evaluations"]["eval_rl"]["success_rate"]
    assert kept["checkpoint"].endswith("0000001")
    assert extended["evaluations"]["eval_rl"]["checkpoint"].endswith("0000002")
    assert extended["evaluations"]["eval"] == results["evaluations"]["eval"]
    assert protocol.run(compose("protocol", more)) == extended  # nothing left to run


def _check_messages_about_finished_phases(root, overrides):
    """What the ``ript protocol`` command says when a finished run is asked for something else, or was damaged."""
    command = ["protocol", "ml45_multitask", *(o for o in overrides if o != "protocol=ml45_multitask")]
    other_count = [o for o in command if not o.startswith("phases.rl.rl.iterations=")]
    assert_one_line_error(ript_here(*other_count, "phases.rl.rl.iterations=1"),  # fewer than it ran
                          "phase rl finished", "without rl.iterations=1")
    assert_one_line_error(ript_here(*other_count, "phases.rl.rl.iterations=3", "phases.rl.rl.lr=1e-4"),  # more, and
                          "phase rl finished", "without rl.lr=0.0001")                                  # changed
    assert_one_line_error(ript_here(*command, "phases.stage0.train.steps=6"),
                          "phase stage0 finished", "without train.steps=6")
    assert_one_line_error(ript_here(*command, "~phases.eval_rl.sampling"),  # the finished phase had it
                          "phase eval_rl finished", "with sampling.greedy=true, which this command does not ask for")
    # a run carried to another host without the folders that no phase still to run reads: stage 0's went into
    # stage 1, which is finished
    shutil.rmtree(root / "stage0")
    assert protocol.run(compose("protocol", overrides))["evaluations"]["eval_rl"]["episodes"] == 4
    shutil.rmtree(root / "eval")  # a finished phase's folder deleted by hand: said as it is, not "continue"
    for _ in range(2):  # and the same on every rerun
        assert_one_line_error(ript_here(*command), "phase eval is recorded as finished in", "protocol.json",
                              f"but its folder {root / 'eval'} is gone")


def test_a_finished_rl_phase_goes_on_only_when_asked_for_more_iterations_and_nothing_else():
    record = {"overrides": ["policy=flow", "rl.iterations=15"], "seconds": 60.0, "step": 15}

    def rl(*overrides: str, last: int = 15) -> protocol.Phase:
        phase = protocol.Phase("rl", "rl", list(overrides))
        phase.last_step = last
        return phase

    assert protocol_state.finished_difference(rl("policy=flow", "rl.iterations=30", last=30), record) == (None, 15)
    assert protocol_state.finished_difference(rl("policy=flow", "rl.iterations=15"), record) == (None, None)
    budget_spent = {**record, "step": 9}  # rl.max_env_steps ended it at iteration 9: the same command skips it
    assert protocol_state.finished_difference(rl("policy=flow", "rl.iterations=15"), budget_spent) == (None, None)
    assert protocol_state.finished_difference(rl("policy=flow", "rl.iterations=30", "rl.lr=0.001", last=30), record) \
        == ("without rl.lr=0.001", None)
    assert protocol_state.finished_difference(rl("policy=flow", "rl.iterations=10", last=10), record) \
        == ("without rl.iterations=10", None)


def test_paths_with_any_characters_reach_every_phase_as_they_are(tiny_data, tmp_path):
    """The overrides the protocol and quickstart generate carry non-ASCII and spaced paths through hydra intact
    (hydra's unquoted grammar refuses them, and reads JSON's \\u escapes literally)."""
    root, data = tmp_path / "prötocol ü 1", tmp_path / "dätä"
    cfg = compose("protocol", protocol_overrides(tiny_data, tmp_path) + [override("run_root", root),
                                                                         override("task.data_dir", data)])
    phases = protocol.plan(cfg)
    jobs = {phase.name: compose(phase.job, phase.overrides) for phase in phases}
    # what each phase loads from the others: the folders that must survive until it has run
    assert {p.name: p.reads for p in phases if p.reads} == {
        "stage1": (root / "stage0",), "eval": (root / "stage1",), "rl": (root / "stage1",), "eval_rl": (root / "rl",)}
    assert jobs["collect"].task.data_dir == str(data) and jobs["stage1"].task.data_dir == str(data)
    assert jobs["stage0"].run_dir == str(root / "stage0") and jobs["stage1"].stage0_checkpoint == str(root / "stage0")
    assert jobs["eval"].out_dir == str(root / "eval") and jobs["eval_rl"].checkpoint == str(root / "rl")
    assert override("run_dir", "/tmp/runs/stage0") == "run_dir=/tmp/runs/stage0"  # plain paths: as recorded before


def test_protocol_settings_are_checked_before_any_phase_runs(tmp_path):
    root = tmp_path / "p"
    with pytest.raises(RiptError, match="evaluate=best needs phases.stage1.eval.every > 0"):
        protocol.run(compose("protocol", [f"run_root={root}", "evaluate=best"]))
    with pytest.raises(RiptError, match="base_checkpoint .* does not exist"):
        protocol.run(compose("protocol", ["protocol=ml45_fewshot", f"run_root={root}",
                                          f"base_checkpoint={tmp_path / 'none'}"]))
    with pytest.raises(RiptError, match=r"phases\.stage1: .*train\.steps=0"):
        protocol.run(compose("protocol", [f"run_root={root}", "phases.stage1.train.steps=0"]))
    assert not root.exists()  # nothing was created
    assert_one_line_error(ript_here("protocol", "ml46"), "unknown protocol 'ml46'", "ml45_multitask")


def test_a_training_phase_of_a_small_batch_runs_on_fewer_gpus_and_rl_on_every_one():
    def ranks(*extra: str) -> dict[str, int]:
        cfg = compose("protocol", ["protocol=libero_10", *extra])
        phases = protocol.plan(cfg)
        protocol.check(cfg, phases)
        return {p.name: p.ranks(4, cfg.min_batch_per_gpu) for p in phases}

    # the shared batch of 256 trains on one GPU of four; RL's rollouts use all; collection and evaluation one
    assert ranks() == {"collect": 1, "stage0": 1, "stage1": 1, "eval": 1, "rl": 4, "eval_rl": 1}
    wide = ranks("+phases.stage1.train.batch_size=1024", "+phases.stage0.train.batch_size=512")
    assert (wide["stage0"], wide["stage1"]) == (2, 4)
    assert ranks("+phases.stage1.train.batch_size=4096")["stage1"] == 4  # never more than the host has
    assert ranks("min_batch_per_gpu=null")["stage0"] == 4
    cmd = protocol.plan(compose("protocol", ["protocol=libero_10"]))[2].command(2)
    assert cmd[:4] == [cmd[0], "-m", "torch.distributed.run", "--standalone"] and "--nproc_per_node=2" in cmd
    with pytest.raises(RiptError, match="min_batch_per_gpu"):
        compose("protocol", ["protocol=libero_10", "min_batch_per_gpu=0"])


def test_every_protocol_composes_with_its_task_and_phases():
    commands = set(typer.main.get_command(cli.app).commands)
    composed = {}  # protocol -> {phase: its job's config}, each composed once
    for name in protocol.protocol_names():
        cfg = compose("protocol", [f"protocol={name}"])
        assert cfg.name == name
        phases = protocol.plan(cfg)
        last = phases[-1].name
        assert last == "eval_rl" or (name.endswith("_base") and last == "flow"), name  # a base only trains
        composed[name] = {phase.name: compose(phase.job, phase.overrides) for phase in phases}
        for phase in phases:
            assert phase.command(1)[3] in commands, (name, phase.command(1))  # a command `ript` has
    for suite in ("libero_10", "libero_90"):
        jobs = composed[suite]
        assert jobs["collect"].task.name == jobs["stage1"].task.name == suite
        assert jobs["rl"].rl.max_env_steps > 0  # capped for the suite's horizon
    assert compose("protocol", ["protocol=libero_spatial"]).task.name == "libero_spatial"
    # the LIBERO-90 flow base: 10 demos of every task trained on; a few-shot protocol starts from it
    base = composed["libero_90_flow_base"]
    assert base["flow"].data.demos_per_task == 10 and base["flow"].task.task_names is None
    fewshot = compose("protocol", ["protocol=libero_goal_flow_fewshot",
                                   "+phases.flow.init_checkpoint=runs/protocols/libero_90_flow_base/flow"])
    flow_phase = next(p for p in protocol.plan(fewshot) if p.name == "flow")
    assert compose(flow_phase.job, flow_phase.overrides).init_checkpoint.endswith("libero_90_flow_base/flow")
    # its RL policy is evaluated by its mode (greedy 99.2%, sampled 96.0%); RL itself samples
    jobs = composed["libero_spatial"]
    assert jobs["eval_rl"].sampling.greedy and not jobs["eval"].sampling.greedy and not jobs["rl"].sampling.greedy
    # the every-demo flow protocols run the weights' average, LIBERO-Object's replanning every 2 actions, LIBERO-
    # Spatial's every 4 (as measured on each suite); a world-model protocol's policy executes as many actions
    # per decision as its world model predicts per step
    for name, horizon in (("libero_object_flow", 2), ("libero_spatial_flow", 4)):
        flow = composed[name]["flow"]
        assert flow.algo.action_horizon == horizon and flow.train.ema_decay == 0.999, name
    for name, jobs in composed.items():
        if "world_model" in jobs:
            assert jobs["flow"].algo.action_horizon == jobs["world_model"].algo.chunk, name
    # every protocol learns the noise-free labels of its own collection; LIBERO's with QueST's image encoder
    for name, jobs in composed.items():
        for phase in ("stage0", "stage1", "finetune"):
            if phase in jobs:
                assert jobs[phase].data.action_key == "expert_actions", (name, phase)
                assert jobs[phase].algo.prior.num_kp == (128 if name.startswith("libero") else 32), (name, phase)


def test_an_rl_phase_cut_by_its_time_limit_is_told_from_one_that_spent_its_env_step_budget(tmp_path):
    # a LIBERO protocol's RL (rl.max_env_steps set) stopped by rl.stop_after_minutes after 3 of 15
    # iterations was recorded as finished and evaluated; the same command again would have skipped the rest
    rl = protocol.Phase("rl", "rl", [], run_dir=tmp_path, last_step=15, env_step_budget=200_000)
    assert protocol.cut_short(rl, 3)  # no record yet: nothing spent
    (tmp_path / "rl_history.json").write_text(json.dumps([{"iteration": 3, "env_steps": 122_000}]))
    assert protocol.cut_short(rl, 3)
    (tmp_path / "rl_history.json").write_text(json.dumps([{"iteration": 5, "env_steps": 201_000}]))
    assert not protocol.cut_short(rl, 5)  # the budget ended it
    assert not protocol.cut_short(rl, 15)
    assert protocol.cut_short(protocol.Phase("rl", "rl", [], run_dir=tmp_path, last_step=15), 5)
    (tmp_path / "rl_history.json").write_text("{")
    with pytest.raises(RiptError, match="rl_history.json"):
        protocol.cut_short(rl, 3)


def test_a_flow_protocol_wires_its_evaluations_and_rl_to_the_flow_policy(tmp_path):
    """A protocol with a flow phase instead of stages 0-1: eval, rl and eval_rl load the flow run as policy=flow (the
    flow job's own run, RL from its checkpoint and the evaluations are tested on the simulator elsewhere)."""
    root = tmp_path / "flow protocol"
    cfg = compose("protocol", ["protocol=libero_object_flow_fewshot", override("run_root", root)])
    phases = {phase.name: phase for phase in protocol.plan(cfg)}
    assert list(phases) == ["collect", "flow", "eval", "rl", "eval_rl"] and protocol.imitation_dir(cfg) == root / "flow"
    jobs = {name: compose(phase.job, phase.overrides) for name, phase in phases.items()}
    assert jobs["flow"].algo.name == "flow" and jobs["flow"].data.demos_per_task == 2
    assert jobs["collect"].task.demos_per_task == 2, "few-shot: only the demos the policy trains on are collected"
    for name in ("eval", "rl", "eval_rl"):
        assert jobs[name].policy.name == "flow", name
    assert jobs["rl"].checkpoint == str(root / "flow") and jobs["rl"].policy.noise_method == "flow_sde"
    assert jobs["eval_rl"].checkpoint == str(root / "rl")
    assert protocol_results.decoding({"action_horizon": 4, "denoise_steps": 4, "ode": True}) == "ode K4 h4"


def test_a_world_model_protocol_runs_rl_in_its_world_model_and_evaluates_in_the_simulator(tmp_path):
    """A world_model phase trains on every demo of the suite and the imitation's recorded evaluation; RL's rollouts
    then run in it, both evaluations in the simulator (the jobs themselves run on the simulator in their own
    tests)."""
    root = tmp_path / "wm protocol"
    cfg = compose("protocol", ["protocol=libero_object_world_model", override("run_root", root),
                               "phases.world_model_head=null", "phases.calibrate=null"])
    phases = {phase.name: phase for phase in protocol.plan(cfg)}
    assert list(phases) == ["collect", "flow", "eval", "world_model", "rl", "eval_rl"]
    jobs = {name: compose(phase.job, phase.overrides) for name, phase in phases.items()}
    assert jobs["flow"].data.demos_per_task == 3 and jobs["world_model"].data.demos_per_task is None
    assert jobs["world_model"].run_dir == str(root / "world_model") and jobs["world_model"].algo.name == "world_model"
    assert jobs["world_model"].task.name == "libero_object"
    assert jobs["world_model"].algo.chunk == 4 and jobs["flow"].algo.action_horizon % 4 == 0
    assert jobs["world_model"].algo.model.output == "warp"
    assert jobs["rl"].environment.name == "world_model"
    assert jobs["rl"].environment.checkpoint == str(root / "world_model")
    assert jobs["eval"].environment.name == "simulator" and jobs["eval_rl"].environment.name == "simulator"
    assert jobs["eval"].record_episodes and not jobs["eval_rl"].record_episodes
    assert list(jobs["world_model"].data.extra_dirs) == [str(root / "eval" / "episodes")]
    assert jobs["rl"].environment.calibration is None
    flow_only = compose("protocol", ["protocol=libero_object_flow_fewshot", override("run_root", root)])
    rl_phase = next(p for p in protocol.plan(flow_only) if p.name == "rl")
    assert compose("rl", rl_phase.overrides).environment.name == "simulator"


def test_a_calibrate_phase_reads_the_imitations_evaluation_in_the_world_model_and_rl_reads_its_threshold(tmp_path):
    root = tmp_path / "wm protocol"
    cfg = compose("protocol", ["protocol=libero_object_world_model", override("run_root", root),
                               "phases.world_model_head=null"])
    phases = {phase.name: phase for phase in protocol.plan(cfg)}
    assert list(phases) == ["collect", "flow", "eval", "world_model", "calibrate", "rl", "eval_rl"]
    protocol.check(cfg, list(phases.values()))
    calibrate, rl = compose("eval", phases["calibrate"].overrides), compose("rl", phases["rl"].overrides)
    assert calibrate.checkpoint == str(root / "flow") and calibrate.policy.name == "flow"
    assert calibrate.calibrate_against == str(root / "eval") and calibrate.out_dir == str(root / "calibrate")
    assert calibrate.environment.name == "world_model"
    assert calibrate.environment.checkpoint == str(root / "world_model") and not calibrate.record_episodes
    assert rl.environment.calibration == str(root / "calibrate")
    assert root / "calibrate" in phases["rl"].reads and root / "eval" in phases["calibrate"].reads
    flow_only = compose("protocol", ["protocol=libero_object_flow_fewshot", override("run_root", root),
                                     "phases.calibrate={}"])
    with pytest.raises(RiptError, match="phases.calibrate reads the world_model phase's output; it is null"):
        protocol.check(flow_only, protocol.plan(flow_only))


def test_a_world_model_head_phase_trains_the_head_again_and_calibrate_and_rl_read_that_world_model(tmp_path):
    root = tmp_path / "wm protocol"
    cfg = compose("protocol", ["protocol=libero_object_world_model", override("run_root", root)])  # the default
    phases = {phase.name: phase for phase in protocol.plan(cfg)}
    assert list(phases) == ["collect", "flow", "eval", "world_model", "world_model_head", "calibrate", "rl", "eval_rl"]
    protocol.check(cfg, list(phases.values()))
    head = phases["world_model_head"]
    assert head.cli_name == "world-model-head" and head.run_dir == root / "world_model_head"
    job = compose("world_model_head", head.overrides)
    assert job.checkpoint == str(root / "world_model") and job.run_dir == str(root / "world_model_head")
    assert head.reads == (root / "world_model",)
    for name in ("calibrate", "rl"):
        job = compose(phases[name].job, phases[name].overrides)
        assert job.environment.checkpoint == str(root / "world_model_head")
        assert root / "world_model_head" in phases[name].reads
    no_model = compose("protocol", ["protocol=libero_object_world_model", override("run_root", root),
                                    "phases.world_model=null", "phases.calibrate=null"])
    with pytest.raises(RiptError, match="phases.world_model_head reads the world_model phase's output; it is null"):
        protocol.check(no_model, protocol.plan(no_model))


def test_a_phase_finished_before_a_setting_existed_is_skipped_only_at_the_value_it_computed_with():
    # a stage finished before algo.image_aug_color existed computed what 0.0 computes now; any other value, or a
    # setting that is not in the added list, still makes it differ
    done = {"overrides": ["algo=quest", "algo.lr=0.001"]}
    same = protocol.Phase("stage1", "stage1", ["algo=quest", "algo.lr=0.001", "algo.image_aug_color=0.0"])
    assert protocol_state.finished_differently(same, done) is None
    jittered = protocol.Phase("stage1", "stage1", ["algo=quest", "algo.lr=0.001", "algo.image_aug_color=0.3"])
    assert protocol_state.finished_differently(jittered, done) == "without algo.image_aug_color=0.3"
    unknown = protocol.Phase("stage1", "stage1", ["algo=quest", "algo.lr=0.001", "algo.image_aug_pad=0"])
    assert protocol_state.finished_differently(unknown, done) == "without algo.image_aug_pad=0"
    # the same value written another way, and a bare word asked for on the command line
    assert protocol_state.finished_differently(protocol.Phase("stage1", "stage1", [*done["overrides"],
                                                                              "algo.image_aug_color=0"]), done) is None
    words = protocol.Phase("eval", "eval", ["environment.starts=first_frames"])
    assert protocol_state.finished_differently(words, {"overrides": []}) is None
    # a run that recorded the setting is compared as it was recorded
    recorded = {"overrides": ["algo=quest", "algo.lr=0.001", "algo.image_aug_color=0.3"]}
    assert protocol_state.finished_differently(same, recorded) == "without algo.image_aug_color=0.0"


def test_the_ten_task_ml45_protocol_shares_the_multitask_phases_and_sizes_stage1_for_its_tasks():
    multi, ten = (compose("protocol", [f"protocol={name}"]) for name in ("ml45_multitask", "ml45_hard10"))
    assert (multi.name, multi.task.name, len(multi.task.task_names or [])) == ("ml45_multitask", "metaworld_ml45", 0)
    assert (ten.name, ten.task.name, len(ten.task.task_names), ten.task.demos_per_task) == \
        ("ml45_hard10", "metaworld_ml45_hard10", 10, 100)
    assert (multi.phases.stage1.train.steps, ten.phases.stage1.train.steps) == (16000, 6000)
    for phase in ("collect", "stage0", "eval", "rl", "eval_rl"):
        assert ten.phases[phase] == multi.phases[phase], phase
    assert ten.phases.stage1.data == multi.phases.stage1.data


def test_the_table_of_a_protocol_that_only_trains_lists_its_phase_times_alone():
    phases = {"collect": {"seconds": 180.0}, "flow": {"seconds": 300.0, "step": 10000}}
    table = protocol_results.protocol_table({"evaluations": {}, "phases": phases})
    assert table.splitlines() == ["collect          3.0 min", "flow             5.0 min (step 10000)",
                                  "all              8.0 min"]


def test_the_table_of_a_protocol_with_a_world_model_head_gives_its_held_out_measures_before_and_after():
    def measured(balanced: float) -> dict:
        return {"chunks": {"precision": 0.5, "recall": 1.0}, "episodes": 12, "successful_episodes": 7,
                "episode_balanced_accuracy": balanced, "episode_best": {"threshold": 0.64, "balanced_accuracy": 0.9}}

    results = {"evaluations": {}, "phases": {"world_model_head": {"seconds": 60.0, "step": 900}},
               "success_head": {"before": measured(0.543), "after": measured(0.8)}}
    rows = protocol_results.protocol_table(results).splitlines()
    assert rows[0].startswith("success head, held-out imagined chunks, before: chunks precision 50.0% recall 100.0%")
    assert rows[1].endswith("12 episodes (7 successful): balanced accuracy 80.0% at 0.5, 90.0% at 0.64")
    assert rows[2] == "world_model_head     1.0 min (step 900)"


def test_a_world_model_protocol_runs_end_to_end_with_its_head_and_calibrate_phases(tiny_data, tmp_path):
    """The ML45 protocol's tiny phases with a world model between imitation and RL, as the LIBERO world-model
    protocols place it: the recorded evaluation in its data, its head trained again on its imagination, the
    threshold calibrated on the imitation's episodes, RL in it, the evaluation after RL in the simulator."""
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    root = tmp_path / "wm"
    overrides = [o for o in protocol_overrides(data, root) if not o.startswith("++phases.eval=")] + [
        f"++phases.eval={EVAL[:-1]}, record_episodes: true}}",
        "++phases.world_model={progress: false, train: {steps: 4, batch_size: 8, warmup_steps: 1, val_every: 2, "
        "save_every: 2, log_every: 1}, data: {val_fraction: 0.34, extra_dirs: ["
        + json.dumps(str(root / "eval" / "episodes"))
        + "]}, algo: {chunk: 2, unroll: 2, model: {width: 8, stages: 2, cond_dim: 32}}}",
        "++phases.world_model_head={steps: 20, batch_size: 16}",
        "++phases.calibrate={episodes_per_task: 2, num_workers: 1, max_episode_steps: 16, n_videos: 0, "
        "environment: {envs: 4}}",
        "++phases.rl.environment={envs: 4}",
    ]
    results = protocol.run(compose("protocol", overrides))
    assert list(results["phases"]) == ["collect", "stage0", "stage1", "eval", "world_model", "world_model_head",
                                       "calibrate", "rl", "eval_rl"]
    assert set(results["success_head"]) == {"before", "after"}
    assert results["calibration"]["world_model"] == str(
        (root / "world_model_head" / "checkpoints" / "last").resolve())
    rl_config = json.loads((root / "rl" / "checkpoints" / "last" / "config.json").read_text())["cfg"]
    assert rl_config["environment"]["checkpoint"] == str(root / "world_model_head")
    assert rl_config["environment"]["calibration"] == str(root / "calibrate")
    assert results["evaluations"]["eval_rl"]["episodes"] == 4
