"""Stages 0 and 1 under torchrun with two gloo processes on the CPU: the global batch is split over ranks and
the gradients averaged, so two processes train the same model as one (dropout off, as in ``quest_small``),
and a stopped two-process run resumes to exactly the uninterrupted one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from ript.config import compose
from ript.errors import RiptError
from ript.stages import stage0, stage1
from tests.helpers.cli import first_scalar, stage1_overrides, train_overrides
from tests.helpers.weights import assert_same_weights, weights


def torchrun(*args: str, timeout: int = 600) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "ript.cli", *args], capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]


def assert_close_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=2e-5, rtol=1e-4, msg=k)


def test_stage0_on_two_processes_equals_one(tiny_data, stage0_run, tmp_path):
    torchrun("stage0", *train_overrides(tiny_data, tmp_path / "two", 4), "device=cpu")
    assert_close_weights(weights(tmp_path / "two"), weights(stage0_run))  # the fixture: one process, 4 steps
    state = torch.load(tmp_path / "two" / "checkpoints" / "last" / "training_state.pt", weights_only=True)
    assert len(state["ranks"]) == 2


@pytest.mark.extended
def test_stage1_on_two_processes_resumes_exactly_and_equals_one(tiny_data, stage0_run, stage1_run, tmp_path):
    s1 = lambda run: [*stage1_overrides(tiny_data, run, stage0_run), "device=cpu"]  # noqa: E731
    torchrun("stage1", *s1(tmp_path / "two"))
    torchrun("stage1", *s1(tmp_path / "part"), "train.stop_after_minutes=0")
    assert (tmp_path / "part" / "checkpoints" / "last").resolve().name == "0000001"
    torchrun("stage1", *s1(tmp_path / "part"), "resume=true")
    assert_same_weights(weights(tmp_path / "part"), weights(tmp_path / "two"))
    assert_close_weights(weights(tmp_path / "two"), weights(stage1_run))  # the fixture: one process
    # rank 0 alone evaluated in the simulator, and pointed checkpoints/best at one of the evaluated steps
    assert sorted(p.name for p in (tmp_path / "two" / "eval").iterdir()) == ["step0000002", "step0000004"]
    assert (tmp_path / "two" / "checkpoints" / "best").resolve().name in ("0000002", "0000004")
    # one process cannot continue a two-process run: its ranks' random streams would be lost
    with pytest.raises(RiptError, match="written by 2 process"):
        stage1.run(compose("stage1", s1(tmp_path / "part") + ["resume=true"]))


def run_job(procs: int, job: str, *args: str) -> None:
    if procs == 2:
        torchrun(job, *args, timeout=240)  # a hang fails in minutes
    else:
        {"stage0": stage0, "stage1": stage1}[job].run(compose(job, list(args)))


@pytest.mark.extended
def test_a_validation_split_smaller_than_the_batch_is_scored_by_two_processes_as_by_one(tiny_data, tmp_path):
    """Three demos a task hold one out: a validation split (138 samples) no larger than the first process's share
    of a batch (140 of 280), so the second process scores none of it (it used to pair its reduction with the
    first's wrongly and wait forever, or fail)."""
    def settings(run_dir, steps):
        training = [o for o in train_overrides(tiny_data, run_dir, steps) if not o.startswith("train.batch_size")]
        return [*training, "train.batch_size=280", "device=cpu"]

    for procs in (1, 2):
        run = tmp_path / f"procs{procs}"
        run_job(procs, "stage0", *settings(run / "stage0", 2))
        run_job(procs, "stage1", *settings(run / "stage1", 2), f"stage0_checkpoint={run / 'stage0'}")
    for stage, tag in (("stage0", "val/l1"), ("stage1", "val/ce")):
        assert first_scalar(tmp_path / "procs2" / stage, tag) == pytest.approx(
            first_scalar(tmp_path / "procs1" / stage, tag), rel=1e-3), stage


def test_batch_share_splits_the_global_batch_evenly():
    from ript.utils.distributed import DistInfo, batch_share

    assert [batch_share(16, DistInfo(r, 2)) for r in range(2)] == [slice(0, 8), slice(8, 16)]
    assert batch_share(16, DistInfo()) == slice(0, 16)
    with pytest.raises(RiptError, match="train.batch_size=15 is not divisible by the 2 processes"):
        batch_share(15, DistInfo(0, 2))


def test_auto_workers_share_the_host_cores_among_its_ranks(monkeypatch):
    from ript.utils import distributed
    from ript.utils.distributed import DistInfo

    monkeypatch.setattr(distributed, "usable_cores", lambda: 32)
    assert DistInfo().cores_per_rank() == 32
    assert DistInfo(1, 4, 1, local_world_size=2).cores_per_rank() == 16
    monkeypatch.setattr(distributed, "usable_cores", lambda: 2)
    assert DistInfo(0, 4, 0, local_world_size=4).cores_per_rank() == 1
