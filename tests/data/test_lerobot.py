"""LeRobotDataset v3.0 export and import on the real MetaWorld files the tests collect."""

import json

import pytest
import torch

from ript.errors import RiptError
from tests.helpers.cli import (
    assert_one_line_error,
    assert_round_trip,
    first_scalar,
    ript_here,
    task_overrides,
    train_overrides,
)

pq = pytest.importorskip("pyarrow.parquet", reason="the lerobot extra: pip install -e .[lerobot]")


def test_export_then_import_gives_the_demos_back(tiny_data, tmp_path):
    from ript.config import compose
    from ript.stages.lerobot_io import run_export, run_import

    out = tmp_path / "lerobot"
    info = run_export(compose("export", task_overrides(tiny_data) + [f"out={out}"]))
    assert info["codebase_version"] == "v3.0" and info["fps"] == 80 and info["total_episodes"] == 6
    # the published v3.0 layout: metadata, one data file, one video per camera
    assert json.loads((out / "meta" / "info.json").read_text()) == info
    stats = json.loads((out / "meta" / "stats.json").read_text())
    assert len(stats["observation.images.corner_rgb"]["mean"]) == 3 and stats["action"]["count"] == [
        info["total_frames"]]
    data = pq.read_table(out / "data" / "chunk-000" / "file-000.parquet")
    assert data.num_rows == info["total_frames"] and {"action", "index", "episode_index", "timestamp"} <= set(
        data.column_names)
    episodes = pq.read_table(out / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pylist()
    assert [e["dataset_to_index"] - e["dataset_from_index"] for e in episodes] == [e["length"] for e in episodes]
    tasks = pq.read_table(out / "meta" / "tasks.parquet").to_pandas()
    assert sorted(tasks.index) == ["press the button on the front of the box", "push the drawer closed"]
    assert all((out / "videos" / f"observation.images.{c}_rgb" / "chunk-000" / "file-000.mp4").is_file()
               for c in ("corner", "gripperPOV"))

    back = tmp_path / "back"
    written = run_import(compose("import", [f"src={out}", f"data_dir={back}"]))
    assert sorted(p.name for p in written) == ["button-press-v3.hdf5", "drawer-close-v3.hdf5"]
    for path in written:
        # actions, simulator states (of different lengths per task), low-dim observations, rewards: exact;
        # 32-pixel frames through AV1 at crf 30: measured ~4-6 levels of 255 on average
        assert_round_trip(tiny_data / path.name, path, mean_image_error=8.0)
    before = written[0].read_bytes()
    with pytest.raises(RiptError, match="exists; import never replaces"):
        run_import(compose("import", [f"src={out}", f"data_dir={back}"]))
    assert written[0].read_bytes() == before


def test_export_and_import_refuse_bad_folders_in_one_line(tiny_data, tmp_path):
    out = tmp_path / "lerobot"
    out.mkdir()
    assert_one_line_error(ript_here("export", *task_overrides(tiny_data), f"out={out}"), str(out), "exists")
    assert_one_line_error(ript_here("import", f"src={tmp_path / 'nothing'}", f"data_dir={tmp_path / 'd'}"),
                          "info.json", "not a LeRobot dataset")
    (out / "meta").mkdir()
    (out / "meta" / "info.json").write_text(json.dumps({"codebase_version": "v2.1"}))
    assert_one_line_error(ript_here("import", f"src={out}", f"data_dir={tmp_path / 'd'}"), "v2.1", "v3.0")
    assert not (tmp_path / "d").exists()


def test_training_reads_a_lerobot_folder_as_it_reads_the_hdf5_files(tiny_data, stage0_run, tmp_path):
    """``task.format=lerobot``: stage 0 (actions only, stored exactly) trains to the same weights as from the
    HDF5 files; stage 1 sees the frames through the codec, so its first loss is close, not equal."""
    from safetensors.torch import load_file

    from ript.config import compose
    from ript.stages import stage0, stage1
    from ript.stages.lerobot_io import run_export

    folder = tmp_path / "lerobot"
    run_export(compose("export", task_overrides(tiny_data) + [f"out={folder}"]))
    runs = {}
    for name, data, extra in (("hdf5", tiny_data, []), ("lerobot", folder, ["task.format=lerobot"])):
        stage0.run(compose("stage0", train_overrides(data, tmp_path / f"s0_{name}", 2) + extra))
        stage1.run(compose("stage1", train_overrides(data, tmp_path / f"s1_{name}", 2) + extra + [
            f"stage0_checkpoint={stage0_run}"]))
        runs[name] = load_file(str(tmp_path / f"s0_{name}" / "checkpoints" / "last" / "model.safetensors"))
    assert all(torch.equal(runs["hdf5"][k], runs["lerobot"][k]) for k in runs["hdf5"])
    ce = [first_scalar(tmp_path / f"s1_{name}", "train/ce") for name in ("hdf5", "lerobot")]
    assert abs(ce[0] - ce[1]) < 0.05, ce
    config = [json.loads((tmp_path / f"s1_{n}" / "checkpoints" / "last" / "config.json").read_text()) for n in
              ("hdf5", "lerobot")]
    assert config[0]["metadata"]["env_args"] == config[1]["metadata"]["env_args"]
    assert len(list(folder.glob(".ript_hdf5-*"))) == 1  # decoded once, reused by stage 1


# one test process runs this file's tests (pytest-xdist, --dist loadgroup), so its module fixture is built once
pytestmark = pytest.mark.xdist_group("test_lerobot")


@pytest.fixture(scope="module")
def exported(tiny_data, tmp_path_factory):
    from ript.config import compose
    from ript.stages.lerobot_io import run_export

    out = tmp_path_factory.mktemp("exported") / "lerobot"
    run_export(compose("export", task_overrides(tiny_data) + [f"out={out}"]))
    return out


def _damaged(exported, tmp_path, damage):
    import shutil

    folder = tmp_path / "lerobot"
    shutil.copytree(exported, folder)
    damage(folder)
    return folder


def _rewrite_info(folder, change):
    path = folder / "meta" / "info.json"
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def _truncate(path, keep: float):
    path.write_bytes(path.read_bytes()[:int(len(path.read_bytes()) * keep)])


@pytest.mark.parametrize("damage,fragments", [
    (lambda f: _rewrite_info(f, lambda i: {k: v for k, v in i.items() if k != "features"}), ("'features'",)),
    (lambda f: _rewrite_info(f, lambda i: [i]), ("info.json holds a list",)),
    (lambda f: _truncate(f / "videos" / "observation.images.corner_rgb" / "chunk-000" / "file-000.mp4", 0.5),
     ("file-000.mp4",)),
    (lambda f: _truncate(f / "data" / "chunk-000" / "file-000.parquet", 0.6), ("unreadable parquet",)),
])
def test_a_malformed_lerobot_folder_is_one_line(exported, tmp_path, damage, fragments):
    from ript.data.lerobot import import_lerobot

    folder = _damaged(exported, tmp_path, damage)
    with pytest.raises(RiptError) as e:
        import_lerobot(folder, tmp_path / "d")
    assert str(folder) in str(e.value) and all(f in str(e.value) for f in fragments) and "\n" not in str(e.value)
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").iterdir())


def test_a_half_written_lerobot_folder_through_the_cli(exported, tmp_path):
    folder = _damaged(exported, tmp_path, lambda f: _truncate(f / "meta/episodes/chunk-000/file-000.parquet", 0.5))
    assert_one_line_error(ript_here("import", f"src={folder}", f"data_dir={tmp_path / 'd'}"), "unreadable parquet")


def test_the_decoded_copy_follows_the_videos_not_only_info_json(exported, tmp_path):
    """Videos replaced under a byte-identical info.json are decoded again, not read from the stale copy."""
    import h5py

    from ript.data.lerobot import decoded_folder

    folder = _damaged(exported, tmp_path, lambda f: None)
    first = decoded_folder(folder)
    videos = folder / "videos"
    a, b = (videos / f"observation.images.{c}_rgb" / "chunk-000" / "file-000.mp4" for c in ("corner", "gripperPOV"))
    a_bytes, b_bytes = a.read_bytes(), b.read_bytes()
    a.write_bytes(b_bytes)
    b.write_bytes(a_bytes)  # the cameras' videos swapped: info.json unchanged
    second = decoded_folder(folder)
    assert second != first
    with h5py.File(first / "button-press-v3.hdf5") as old, h5py.File(second / "button-press-v3.hdf5") as new:
        assert (new["data/demo_0/obs/corner_rgb"][()] == old["data/demo_0/obs/gripperPOV_rgb"][()]).all()
