"""A task's file is checked against the task it is loaded for."""

import shutil

from tests.helpers.cli import assert_one_line_error, ript_here, train_overrides


def test_a_file_of_another_task_is_refused_naming_both(tiny_data, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    shutil.copy(data / "button-press-v3.hdf5", data / "drawer-close-v3.hdf5")  # replaced by another task's file
    run = tmp_path / "run"
    assert_one_line_error(ript_here("stage0", *train_overrides(data, run, 2)), f"{data / 'drawer-close-v3.hdf5'}",
                          "task 'button-press-v3'", "loaded for task 'drawer-close-v3'")
    assert not run.exists()
