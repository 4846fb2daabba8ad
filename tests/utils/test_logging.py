"""Metric logging through the real backends: W&B offline (the `wandb` extra, installed by scripts/install.sh)."""

import torch

from ript.config import compose
from ript.stages import stage0
from tests.helpers.cli import train_overrides


def test_wandb_offline_run_logs_metrics_and_keeps_its_id_across_a_resume(tiny_data, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    args = train_overrides(tiny_data, run, 4) + ["logger=wandb", "logger.wandb_mode=offline"]
    stage0.run(compose("stage0", args + ["train.stop_after_minutes=0"]))  # stops after step 1
    stage0.run(compose("stage0", args + ["resume=true"]))
    run_id = torch.load(run / "checkpoints" / "last" / "training_state.pt", weights_only=True)["logger_run_id"]
    parts = sorted((run / "wandb").glob("offline-run-*"))
    # one offline run folder per process, both under the run id the checkpoints carry (W&B joins them on sync)
    assert len(parts) == 2 and all(p.name.endswith(f"-{run_id}") for p in parts), parts
    logs = [(p / f"run-{run_id}.wandb").read_bytes() for p in parts]
    # the metric names are in each part's record log: step 1 before the stop, the validation after the resume
    assert all(b"train/l1" in log and b"train/lr" in log for log in logs)
    assert b"val/l1" in logs[1]
