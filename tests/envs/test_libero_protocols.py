"""The LIBERO-90 protocol on the real simulator, shrunk to one task: the scripted expert's demo, stages 0-1 and the
evaluation, each phase its own job. (Its RL phases are those every protocol runs, in jobs as tests/stages/
test_protocol.py runs them on MetaWorld and on LIBERO in tests/envs/test_libero_env.py; LIBERO-10's protocol differs
only in its suite and RL budget, checked where every protocol is composed.)"""

from __future__ import annotations

import json

import pytest

from ript.config import compose, override
from ript.stages import protocol

EVAL = "{episodes_per_task: 1, num_workers: 1, max_episode_steps: 12, n_videos: 0}"
TRAIN = "steps: 2, batch_size: 8, warmup_steps: 1, val_every: 2, save_every: 2, log_every: 1"
TASK = "KITCHEN_SCENE10_close_the_top_drawer_of_the_cabinet"


@pytest.mark.extended
def test_the_libero_90_protocol_runs_its_imitation_phases_on_one_task(tmp_path):
    root = tmp_path / "libero_90"
    overrides = [
        "protocol=libero_90", "algo=quest_small", override("run_root", root), "gpus=1", f"task.task_names=[{TASK}]",
        override("task.data_dir", tmp_path / "data"), "task.demos_per_task=1",
        "task.render.image_size=32",
        "++phases.collect={episodes_per_job: 1, num_workers: 1}",
        f"++phases.stage0={{progress: false, train: {{{TRAIN}}}, data: {{val_fraction: 0}}}}",
        f"++phases.stage1={{progress: false, train: {{{TRAIN}}}, data: {{val_fraction: 0}}}}",
        f"++phases.eval={EVAL}",
        "phases.rl=null", "phases.eval_rl=null",
    ]
    results = protocol.run(compose("protocol", overrides))
    state = json.loads((root / "protocol.json").read_text())
    assert list(state["phases"]) == ["collect", "stage0", "stage1", "eval"]
    evaluation = results["evaluations"]["eval"]
    assert evaluation["episodes"] == 1 and list(evaluation["per_task"]) == [TASK]
    assert (tmp_path / "data" / f"{TASK}_demo.hdf5").is_file()
