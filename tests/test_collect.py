import h5py
import numpy as np

from conftest import TASKS


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
                assert g["states"].shape[0] == t and g["rewards"].shape == (t,)
                assert g["dones"][-1] == 1 and g["dones"][:-1].sum() == 0
                assert bool(g.attrs["success"])  # success filtering is on by default
            assert data.attrs["total"] == total
    assert not list(tiny_data.glob(".*"))  # no temporary or shard files left behind


def test_collect_skips_finished_files_and_is_deterministic(tiny_data, tmp_path):
    from conftest import task_overrides
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
