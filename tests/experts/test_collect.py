import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np

from tests.helpers.cli import TASKS, task_overrides
from tests.helpers.faults import processes


def test_collected_files_have_the_robomimic_layout(tiny_data):
    for task in TASKS:
        path = tiny_data / f"{task}.hdf5"
        with h5py.File(path, "r") as f:
            data = f["data"]
            assert data.attrs["task_name"] == task
            assert data.attrs["instruction"]
            assert '"render"' in data.attrs["env_args"]
            demos = sorted(data)
            assert demos == ["demo_0", "demo_1", "demo_2"]
            total = 0
            for name in demos:
                g = data[name]
                t = len(g["actions"])
                total += t
                assert g["actions"].shape == (t, 4)
                assert g["obs/corner_rgb"].shape == (t, 32, 32, 3)
                assert g["obs/gripperPOV_rgb"].dtype == np.uint8
                assert g["obs/robot_states"].shape == (t, 4)
                # the expert's command before the collection noise (metaworld: std 0.2), clipped as the env clips
                clean, executed = g["expert_actions"][()], g["actions"][()]
                assert clean.shape == (t, 4) and np.abs(clean).max() <= 1.0
                moved = np.abs(executed - clean)[np.abs(clean) < 0.5]  # away from the clip, the full noise shows
                assert 0.1 < moved.mean() < 0.25, moved.mean()
                assert g["states"].shape[0] == t and g["rewards"].shape == (t,)
                assert g["dones"][-1] == 1 and g["dones"][:-1].sum() == 0
                assert bool(g.attrs["success"])  # success filtering is on by default
            assert data.attrs["total"] == total
    assert not list(tiny_data.glob(".*"))  # no temporary or shard files left behind


def test_collect_skips_finished_files_and_is_deterministic(tiny_data, tmp_path):

    from ript.config import compose
    from ript.stages import collect

    before = {p.name: p.stat().st_mtime_ns for p in tiny_data.glob("*.hdf5")}
    assert collect.run(compose("collect", task_overrides(tiny_data))) == {}
    assert {p.name: p.stat().st_mtime_ns for p in tiny_data.glob("*.hdf5")} == before

    # the same seeds give the same demos however the work is split into jobs
    overrides = task_overrides(tmp_path) + ["task.task_names=[button-press-v3]", "episodes_per_job=3",
                                            "num_workers=1"]
    collect.run(compose("collect", overrides))
    with h5py.File(tmp_path / "button-press-v3.hdf5") as a, h5py.File(tiny_data / "button-press-v3.hdf5") as b:
        for name in ("demo_0", "demo_2"):
            assert np.array_equal(a[f"data/{name}/actions"][()], b[f"data/{name}/actions"][()])


def _demo_contents(path):
    """Every dataset and attribute of a demonstration file, for comparing two files' contents."""
    out = {}
    with h5py.File(path, "r") as f:
        out["attrs"] = {k: str(v) for k, v in f["data"].attrs.items()}

        def visit(name, obj):
            out[name] = (obj[()].tobytes() if isinstance(obj, h5py.Dataset)
                         else {k: str(v) for k, v in obj.attrs.items()})

        f["data"].visititems(visit)
    return out


def _live_processes_in_group(pgid: int) -> list[int]:
    """Processes of a process group that are not zombies (an orphan's zombie waits for init to reap it)."""
    return [p["pid"] for p in processes() if p["pgid"] == pgid and p["state"] != "Z"]


def _collect_cmd(data_dir, *extra):

    return [sys.executable, "-m", "ript.cli", "collect", *task_overrides(data_dir), "episodes_per_job=1",
            "num_workers=2", *extra]


def test_killed_collect_refuses_other_settings_and_resumes_with_the_same(tiny_data, tmp_path):
    data = tmp_path / "data"
    proc = subprocess.Popen(_collect_cmd(data), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    # jobs run in task order: the first task's file appears as soon as its own jobs are done
    deadline = time.time() + 240
    while time.time() < deadline and not ((data / "button-press-v3.hdf5").exists()
                                          and list(data.glob(".drawer-close-v3.shard*.hdf5"))):
        time.sleep(0.05)
    proc.kill()  # kill -9 of the parent only: its workers must not outlive it
    proc.wait()
    shards = sorted(p.name for p in data.glob(".*.shard*.hdf5"))
    # the unfinished task's shards; the finished one's only if the kill fell between its file and their removal
    assert any(s.startswith(".drawer-close-v3.") for s in shards), shards
    assert all(s.startswith(".drawer-close-v3.") or (data / "button-press-v3.hdf5").exists() for s in shards)
    assert [p.name for p in data.glob("[!.]*.hdf5")] == ["button-press-v3.hdf5"]
    deadline = time.time() + 20
    while time.time() < deadline and _live_processes_in_group(proc.pid):
        time.sleep(0.2)
    assert not _live_processes_in_group(proc.pid)  # no worker or helper process of the killed run is left
    (data / f".button-press-v3.hdf5.{proc.pid}.tmp").write_bytes(b"half")  # as a killed writer leaves it

    other = subprocess.run(_collect_cmd(data, "noise=0.1"), capture_output=True, text=True, timeout=300)
    assert other.returncode == 2
    error = [line for line in other.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and "other settings" in error[0] and "noise=0.2" in error[0], other.stderr
    assert sorted(p.name for p in data.glob(".*.shard*.hdf5")) == shards  # nothing mixed in, nothing deleted
    assert [p.name for p in data.glob("[!.]*.hdf5")] == ["button-press-v3.hdf5"]

    same = subprocess.run(_collect_cmd(data), capture_output=True, text=True, timeout=300)
    assert same.returncode == 0, same.stderr
    assert "resuming" in same.stderr
    assert sorted(p.name for p in data.iterdir()) == [f"{t}.hdf5" for t in TASKS]  # no shard or .tmp left
    for task in TASKS:  # exactly what the uninterrupted collection wrote
        assert _demo_contents(data / f"{task}.hdf5") == _demo_contents(tiny_data / f"{task}.hdf5")


def test_every_suite_names_a_registered_episode_source():
    """``ript collect`` finds a suite's scripted experts by the family the suite names, registered in EXPERTS when
    the collector looks it up; a name nobody registered is a one-line error naming the ones that are."""
    import pytest

    from ript.envs.suites import SUITES
    from ript.errors import RiptError
    from ript.experts.collect import episode_source
    from ript.experts.libero.episode import LiberoEpisodes
    from ript.experts.metaworld import MetaWorldEpisodes

    families = {name: type(episode_source(suite.expert)) for name, suite in SUITES.items()}
    assert families.pop("metaworld") is MetaWorldEpisodes
    assert set(families.values()) == {LiberoEpisodes} and "libero_goal" in families
    with pytest.raises(RiptError, match="unknown scripted expert 'robocasa'; registered: libero, metaworld"):
        episode_source("robocasa")


def test_finished_files_are_reused_only_with_their_settings(tiny_data, tmp_path):
    """A finished task file made with other settings (or with none recorded) is not kept as if it matched: the
    run stops with one line naming the file, the setting and the way out, and touches nothing."""
    import shutil

    from tests.helpers.cli import assert_one_line_error, ript_here

    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    before = _demo_contents(data / "button-press-v3.hdf5")
    assert_one_line_error(ript_here(*_collect_cmd(data, "noise=0.1")[3:]), "button-press-v3.hdf5",
                          "noise=0.2 (this run: 0.1)", "task.data_dir", "delete")
    from dataclasses import replace

    import pytest

    from ript.config import compose, to_dict
    from ript.envs.suites import task_horizon
    from ript.errors import RiptError
    from ript.experts.collect import Collection

    cfg = compose("collect", task_overrides(data))
    same = Collection(str(cfg.task.suite), data, 3, to_dict(cfg.task.render), task_horizon(cfg.task), 0,
                      float(cfg.task.expert_noise), True, "{name}.hdf5")
    assert same.reusable("button-press-v3")
    for change, words in [({"seed": 3}, "seed=0 (this run: 3)"), ({"demos_per_task": 4}, "demos_per_task=3 (this"),
                          ({"render": {**same.render, "image_size": 48}}, "render="),
                          ({"max_episode_steps": 150}, "max_episode_steps=120 (this run: 150)")]:
        with pytest.raises(RiptError, match="other settings") as e:
            replace(same, **change).reusable("button-press-v3")
        assert words in str(e.value)
    with h5py.File(data / "drawer-close-v3.hdf5", "a") as f:
        del f["data"].attrs["collection"]  # as files written before the settings were recorded
    assert_one_line_error(ript_here(*_collect_cmd(data, "task.task_names=[drawer-close-v3]")[3:]),
                          "drawer-close-v3.hdf5", "records no collection settings")
    assert _demo_contents(data / "button-press-v3.hdf5") == before
    assert not list(data.glob(".*"))


def test_disk_full_while_merging_a_task_file_is_one_line_and_keeps_the_shards(tiny_data, tmp_path):
    """h5py reports a failed write during the merge as RuntimeError (errno 28 inside its message): the command
    ends with one line, the finished shard stays, and the same command merges it once there is space."""
    import json
    import shutil

    import pytest

    from ript.config import compose, to_dict
    from ript.envs.suites import task_horizon
    from ript.experts.collect import Collection, job_settings
    from tests.helpers.cli import assert_one_line_error, ript, ript_here
    from tests.helpers.faults import fill_disk

    fs = tmp_path / "fs"
    fs.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(fs)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        args = [*task_overrides(fs), "task.task_names=[button-press-v3]", "episodes_per_job=3", "num_workers=1"]
        cfg = compose("collect", args)
        job = Collection(str(cfg.task.suite), fs, 3, to_dict(cfg.task.render), task_horizon(cfg.task), 0,
                         float(cfg.task.expert_noise), True, "{name}.hdf5").jobs(["button-press-v3"], 3)[0]
        shard = fs / ".button-press-v3.shard00000.hdf5"
        shutil.copy(tiny_data / "button-press-v3.hdf5", shard)  # a finished job's shard: only the merge is left
        with h5py.File(shard, "a") as f:
            f["data"].attrs["shard"] = json.dumps(job_settings(job))
        (fs / "spare").write_bytes(b"\0" * 65536)
        fill_disk(fs)
        (fs / "spare").unlink()  # room to create the merged file, not to fill it
        assert_one_line_error(ript_here("collect", *args), "no space left", ".button-press-v3.hdf5")
        assert sorted(p.name for p in fs.iterdir()) == [shard.name, "filler"]
        (fs / "filler").unlink()
        code, _, err = ript("collect", *args)
        assert code == 0, err
        assert sorted(p.name for p in fs.iterdir()) == ["button-press-v3.hdf5"]
    finally:
        subprocess.run(["umount", "-l", str(fs)], check=False)


def test_a_second_collect_into_a_folder_being_collected_ends_in_one_line_and_ctrl_c_says_how_to_continue(
        tiny_data, tmp_path):
    # the second merged and deleted the first's shards: the first reported 6/6 demos, its files held 4
    data = tmp_path / "data"
    one_task = ["task.task_names=[button-press-v3]", "num_workers=1"]
    first = subprocess.Popen(_collect_cmd(data, *one_task), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not list(data.glob(".button-press-v3.shard*.hdf5")):
            assert first.poll() is None, first.communicate()
            time.sleep(0.05)
        os.killpg(first.pid, signal.SIGSTOP)  # paused, it still holds the folder however slowly the second starts
        try:
            second = subprocess.run(_collect_cmd(data, *one_task), capture_output=True, text=True, timeout=300)
        finally:
            os.killpg(first.pid, signal.SIGCONT)
        errors = [line for line in second.stderr.splitlines() if line.startswith("error: ")]
        assert second.returncode == 2 and len(errors) == 1, second.stderr
        assert f"{data} is being written by PID {first.pid}" in errors[0] and "ript collect" in errors[0], errors[0]
        first.send_signal(signal.SIGINT)  # Ctrl-C: collect takes no resume=true; the same command continues
        _, err = first.communicate(timeout=120)
    finally:
        first.kill()
    assert first.returncode == 130 and "run the same command again" in err and "resume=true" not in err, err
    again = subprocess.run(_collect_cmd(data, *one_task), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in data.iterdir()) == ["button-press-v3.hdf5"]
    assert _demo_contents(data / "button-press-v3.hdf5") == _demo_contents(tiny_data / "button-press-v3.hdf5")


def test_a_collection_merges_only_the_shards_its_own_jobs_wrote(tiny_data, tmp_path):
    # a task's merge took every shard in the folder, and deleted them, another writer's included
    data = tmp_path / "data"
    proc = subprocess.Popen(_collect_cmd(data, "task.task_names=[button-press-v3]", "num_workers=1"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not list(data.glob(".button-press-v3.shard*.hdf5")):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    foreign = data / ".button-press-v3.shard00099.hdf5"  # written meanwhile by a writer that takes no lock
    shutil.copy(tiny_data / "button-press-v3.hdf5", foreign)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert foreign.is_file()
    assert _demo_contents(data / "button-press-v3.hdf5") == _demo_contents(tiny_data / "button-press-v3.hdf5")


def test_an_expert_short_of_its_demos_is_one_line_naming_the_task_and_its_kept_episodes(tmp_path):
    """``ript collect`` and the benchmarks' demo helper both refuse a task whose expert fell short; the rest pass."""
    import pytest

    from ript.errors import RiptError
    from ript.experts.collect import require_complete

    stats = {"reach-v3": {"demos": 3, "attempts": 3, "successes": 3},
             "door-open-v3": {"demos": 1, "attempts": 9, "successes": 1}}
    require_complete({"reach-v3": stats["reach-v3"]}, 3, tmp_path)
    with pytest.raises(RiptError, match=r"only 1 of 3 successful demos for 'door-open-v3' in 9 attempts") as err:
        require_complete(stats, 3, tmp_path)
    assert str(tmp_path / ".door-open-v3.incomplete.hdf5") in str(err.value) and "\n" not in str(err.value)


def test_runs_hand_out_every_job_once_in_order_and_shrink_towards_the_end():
    from ript.experts.collect import Job, work_runs

    jobs = [Job("metaworld", f"task-{i // 10}", 5 * (i % 10), 5, 0, 0.1, True, 20, {}, 100, f"shard{i}")
            for i in range(100)]
    runs = list(work_runs(jobs, workers=16))
    assert [job for run in runs for job in run] == jobs
    sizes = [len(run) for run in runs]
    assert sizes[0] == 4 and sizes[-1] == 1  # 100 / 32 jobs first, one at a time at the end
    assert sizes == sorted(sizes, reverse=True)
    assert list(work_runs(jobs[:3], workers=16)) == [[jobs[0]], [jobs[1]], [jobs[2]]]
    assert list(work_runs([], workers=4)) == []


def test_small_jobs_keep_enough_retries_and_large_ones_a_bounded_number(tmp_path):
    from ript.experts.collect import Collection

    run = Collection("metaworld", tmp_path, 50, {}, 100, 0, 0.1, True, "{name}.hdf5")
    attempts = {n: run.jobs(["reach-v3"], n)[0].max_attempts for n in (1, 2, 5, 10, 50)}
    assert attempts == {1: 13, 2: 14, 5: 20, 10: 40, 50: 140}
    assert [job.num_episodes for job in run.jobs(["reach-v3"], 20)] == [20, 20, 10]


def test_a_shard_made_with_another_retry_budget_is_named_by_it(tmp_path):
    """Shards left by an interrupted run whose jobs had another retry budget (an older rule) are refused, and the
    one line says which setting differs."""
    import dataclasses
    import json

    import pytest

    from ript.data.hdf5 import write_demo_file
    from ript.errors import RiptError
    from ript.experts.collect import Collection, job_settings, plan_jobs

    run = Collection("metaworld", tmp_path, 2, {}, 100, 0, 0.1, True, "{name}.hdf5")
    job = run.jobs(["reach-v3"], 1)[0]
    older = dataclasses.replace(job, max_attempts=4)
    write_demo_file(Path(job.shard_path), [], {"shard": json.dumps(job_settings(older)), "attempts": 4})
    with pytest.raises(RiptError, match=r"other settings \(max_attempts=4\)"):
        plan_jobs(run.jobs(["reach-v3"], 1), tmp_path, ["reach-v3"])


def test_the_schedule_model_gives_the_figures_the_speed_docs_cite(capsys, monkeypatch):
    """benchmarks/collect_schedule_model.py models collection's own ``work_runs`` on the experts' file."""
    import sys

    from benchmarks import collect_schedule_model

    monkeypatch.setattr(sys, "argv", ["collect_schedule_model", "--experts",
                                      "benchmarks/results/experts_libero_90_10_goal_2026-11-26.json"])
    collect_schedule_model.main()
    out = capsys.readouterr().out
    assert "libero_goal: 100 jobs" in out and "5.1 min (69% busy), runs as workers free up 4.3 min" in out
    assert "libero_90: 900 jobs" in out and "42.7 min" in out and "34.9 min" in out
    # LIBERO-10 on 32 workers with the collection's own expert success, failures drawn: the measured run took
    # 5.9 min at 61% busy (collect_libero_10_32_workers_2026-11-28.log)
    measured = ["collect_schedule_model", "--experts", "benchmarks/results/experts_libero_90_10_goal_2026-11-26.json",
                "--suites", "libero_10", "--workers", "32", "--step-ms", "44", "--draws", "20",
                "--collect-log", "benchmarks/results/collect_libero_10_32_workers_2026-11-28.log"]
    for per_job, figure in ((5, "runs as workers free up 5.7 min (58% busy"), (2, "free up 4.5 min (73% busy")):
        monkeypatch.setattr(sys, "argv", measured + ["--episodes-per-job", str(per_job)])
        collect_schedule_model.main()
        assert figure in capsys.readouterr().out
