import os
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from ript.data.dataset import ChunkDataset, DatasetSpec, batch_indices
from ript.data.hdf5 import Demo, read_demos, write_demo_file
from ript.errors import RiptError


def write_synthetic(path, lengths=(5, 7), action_dim=3, attrs=None):
    demos = []
    for i, n in enumerate(lengths):
        actions = np.stack([np.full(action_dim, 100 * i + t, dtype=np.float32) for t in range(n)])
        img = np.zeros((n, 4, 4, 3), dtype=np.uint8)
        img[:, 0, :, 0] = np.arange(n)[:, None]  # top row marks the frame index
        demos.append(Demo(actions=actions, obs={"agentview_rgb": img, "joint_states": actions[:, :2] * 2}))
    write_demo_file(path, demos, attrs or {"task_name": path.stem, "instruction": "do it"})
    return path


def spec(files, **kw):
    base = dict(files=files, obs_keys={"cam_rgb": "agentview_rgb", "state": "joint_states"}, chunk_size=4,
                frame_stack=2, val_fraction=0.0)
    return DatasetSpec(**{**base, **kw})


def test_windows_padding_and_frame_stack(tmp_path):
    ds = ChunkDataset(spec([write_synthetic(tmp_path / "a.hdf5")]), "all")
    assert len(ds) == 12 and ds.num_demos == 2
    b = ds.get_batch(torch.tensor([0, 3, 5]))
    # demo 0, t=3: actions 3, 4, then the last action repeated and masked
    assert b["actions"][1, :, 0].tolist() == [3, 4, 4, 4]
    assert b["action_mask"][1].tolist() == [True, True, False, False]
    # first frame of an episode is repeated to fill the stack; stacks never cross episodes
    assert b["obs"]["cam_rgb"][0, :, 0, 0, 0].tolist() == [0, 0]
    assert b["obs"]["cam_rgb"][2, :, 0, 0, 0].tolist() == [0, 0]  # sample 5 is demo 1, t=0
    assert b["actions"][2, 0, 0] == 100
    assert b["obs"]["cam_rgb"][1, :, 0, 0, 0].tolist() == [2, 3]


def test_a_task_whose_validation_share_rounds_to_none_trains_on_every_demo(tmp_path):
    path = write_synthetic(tmp_path / "few.hdf5", lengths=(3, 4, 5))
    assert ChunkDataset(spec([path], val_fraction=0.1), "train").num_demos == 3
    with pytest.raises(RiptError):  # nothing held out: the val split is empty, and says so
        ChunkDataset(spec([path], val_fraction=0.1), "val")
    assert ChunkDataset(spec([path], val_fraction=0.34), "val").num_demos == 1


def test_flip_and_instruction_from_libero_problem_info(tmp_path):
    path = write_synthetic(tmp_path / "b.hdf5", attrs={"problem_info": {"language_instruction": "pick it"}})
    ds = ChunkDataset(spec([path], flip_keys=("cam_rgb",)), "all")
    assert ds.instructions == ["pick it"]
    assert ds.obs["cam_rgb"][1, -1, 0, 0] == 1  # the marked top row is now the bottom row


def test_split_by_demo_is_disjoint_and_seeded(tmp_path):
    path = write_synthetic(tmp_path / "c.hdf5", lengths=(3, 4, 5, 6, 7))
    train = ChunkDataset(spec([path], val_fraction=0.4), "train")
    val = ChunkDataset(spec([path], val_fraction=0.4), "val")
    assert train.num_demos == 3 and val.num_demos == 2
    starts = lambda d: set(d.actions[:, 0].int().tolist())  # noqa: E731
    assert not starts(train) & starts(val)
    assert starts(ChunkDataset(spec([path], val_fraction=0.4), "val")) == starts(val)
    # each split decompresses only its own demos
    picked = read_demos(path, {"state": "joint_states"}, pick=lambda n: [n - 1, 1])
    assert [d.actions[0, 0] for d in picked] == [400, 100]


def test_the_learnt_labels_are_chosen_by_action_key(tmp_path):
    path = write_synthetic(tmp_path / "a.hdf5")
    with h5py.File(path, "a") as f:
        for name in ("demo_0", "demo_1"):
            f[f"data/{name}/expert_actions"] = -f[f"data/{name}/actions"][()]
    executed = ChunkDataset(spec([path]), "all").actions
    clean = ChunkDataset(spec([path], action_key="expert_actions"), "all").actions
    assert torch.equal(clean, -executed) and executed.abs().sum() > 0


def test_batch_order_depends_only_on_seed_and_epoch():
    assert torch.equal(batch_indices(10, 4, 3, 0), batch_indices(10, 4, 3, 0))
    assert not torch.equal(batch_indices(10, 4, 3, 0), batch_indices(10, 4, 4, 0))
    assert batch_indices(10, 4, 0, 0).shape == (2, 4)


def test_bad_files_give_one_line_errors(tmp_path):
    keys = {"cam_rgb": "agentview_rgb"}
    with pytest.raises(RiptError, match="does not exist"):
        read_demos(tmp_path / "missing.hdf5", keys)
    good = write_synthetic(tmp_path / "good.hdf5")
    truncated = tmp_path / "truncated.hdf5"
    truncated.write_bytes(good.read_bytes()[:3000])
    with pytest.raises(RiptError, match="truncated.hdf5"):
        read_demos(truncated, keys)
    with pytest.raises(RiptError, match="action dim 3 but the config expects 4"):
        read_demos(good, keys, action_dim=4)
    with pytest.raises(RiptError, match=r"demo_0/obs/nope is missing"):
        read_demos(good, {"x": "nope"})
    with h5py.File(good, "a") as f:
        f["data/demo_1/actions"][2, 1] = np.nan
    with pytest.raises(RiptError, match=r"good.hdf5:data/demo_1/actions contains NaN"):
        read_demos(good, keys)
    for err in (RiptError,):
        assert "\n" not in str(pytest.raises(err, read_demos, good, keys).value)
    # an official-layout file has no noise-free labels: say which key, and where it comes from
    with pytest.raises(RiptError, match=r"good.hdf5:data/demo_0/expert_actions is missing \(only files `ript collect`"):
        read_demos(good, keys, action_key="expert_actions")


def test_a_dataset_too_large_for_the_gpu_stays_in_host_memory():
    from ript.data.dataset import GPU_DATA_SHARE, fits_on_device

    free = 80 * 2**30
    assert fits_on_device(int(GPU_DATA_SHARE * free), free)
    assert not fits_on_device(int(GPU_DATA_SHARE * free) + 1, free)  # ML45 x 100 demos at 128 px: ~60 GiB


def test_batches_served_from_host_memory_equal_the_stored_ones(tmp_path):
    files = [write_synthetic(tmp_path / "a.hdf5"), write_synthetic(tmp_path / "b.hdf5", lengths=(4,))]
    stored, served = ChunkDataset(spec(files), "all"), ChunkDataset(spec(files), "all").serve_to("cpu")
    assert served.nbytes == stored.nbytes > 0
    idx = torch.tensor([0, 3, 5, 12, 15])
    a, b = stored.get_batch(idx), served.get_batch(idx)
    assert a.keys() == b.keys() and all(torch.equal(a["obs"][k], b["obs"][k]) for k in a["obs"])
    assert all(torch.equal(a[k], b[k]) for k in ("actions", "action_mask", "task_ids"))


def test_loading_peaks_at_the_data_plus_two_demos(tmp_path):
    """Demos are read one at a time straight into the final arrays: the peak is the data plus the demo being read
    and the one before it (joining per-demo arrays peaked at 1.5x-2x: ML45 at 128 px would not fit a 128 GB
    host). One demo here is a sixth of the data; in ML45, 1/4,500."""
    import tracemalloc

    demos = []
    for i in range(6):
        img = np.full((50, 64, 64, 3), i, dtype=np.uint8)
        demos.append(Demo(actions=np.zeros((50, 3), np.float32), obs={"a_rgb": img, "b_rgb": img.copy()}))
    path = tmp_path / "big.hdf5"
    write_demo_file(path, demos, {"task_name": "big", "instruction": "do it"})
    data = 2 * 6 * 50 * 64 * 64 * 3
    tracemalloc.start()
    ds = ChunkDataset(DatasetSpec([path], {"a": "a_rgb", "b": "b_rgb"}, chunk_size=4, frame_stack=1), "all")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert ds.nbytes >= data
    assert peak < data * (1 + 2.5 / 6), peak / data


def test_files_read_by_several_processes_equal_one_process(tmp_path):
    files = [write_synthetic(tmp_path / f"t{i}.hdf5", lengths=tuple(range(3 + i, 9 + i))) for i in range(5)]
    for split in ("train", "val"):
        one = ChunkDataset(spec(files, val_fraction=0.34, load_workers=1), split)
        many = ChunkDataset(spec(files, val_fraction=0.34, load_workers=3), split)
        for name in ("actions", "task_ids", "episode_start", "episode_end"):
            assert torch.equal(getattr(one, name), getattr(many, name)), name
        assert all(torch.equal(one.obs[k], many.obs[k]) for k in one.obs)
        assert many.num_demos == one.num_demos and many.task_names == one.task_names


LEFT_BEHIND_GROUP = """
import gc, sys, tempfile
from pathlib import Path
import torch, torch.distributed as dist
import ript.data.loading as loading
from tests.data.test_dataset import spec, write_synthetic
from ript.data.dataset import ChunkDataset
gc.disable()  # the group below stays garbage until a collection, as it may in a long-running process
store = dist.FileStore(tempfile.mktemp(), 1)
group = dist.ProcessGroupGloo(store, 0, 1)
group.allreduce([torch.ones(2)]).wait()  # its threads run now
class Holder: pass
holder = Holder(); holder.group, holder.me = group, holder  # garbage only the collector frees
del holder, group
fill = loading._fill
def collecting_fill(*args):
    gc.collect()  # in the reader, what an automatic collection there may do
    fill(*args)
loading._fill = collecting_fill
files = [write_synthetic(Path(sys.argv[1]) / f"t{i}.hdf5") for i in range(3)]
print(ChunkDataset(spec(files, load_workers=2), "all").num_demos)
"""


def test_reader_processes_finish_with_a_gloo_group_left_as_garbage(tmp_path):
    """A forked reader must not collect the parent's garbage: a gloo group's destructor there waits forever for
    threads that did not survive the fork (the reading ran in a process of its own, cut off if it hangs)."""
    proc = subprocess.Popen([sys.executable, "-c", LEFT_BEHIND_GROUP, str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2],
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the readers too
        proc.communicate()
        pytest.fail("reading with forked processes hung with a gloo group left as garbage")
    assert proc.returncode == 0, err
    assert out.split()[-1] == "6"


def test_a_bad_file_read_by_a_worker_process_is_one_line_naming_it(tmp_path):
    files = [write_synthetic(tmp_path / f"t{i}.hdf5") for i in range(3)]
    with h5py.File(files[2], "a") as f:
        f["data/demo_1/actions"][2, 0] = np.nan
    with pytest.raises(RiptError, match=r"t2.hdf5:data/demo_1/actions contains NaN"):
        ChunkDataset(spec(files, load_workers=2), "all")
    other = write_synthetic(tmp_path / "wide.hdf5", action_dim=3)
    with h5py.File(other, "a") as f:  # another image size than the first file's
        for d in ("demo_0", "demo_1"):
            n = f[f"data/{d}/actions"].shape[0]
            del f[f"data/{d}/obs/agentview_rgb"]
            f[f"data/{d}/obs/agentview_rgb"] = np.zeros((n, 8, 8, 3), np.uint8)
    with pytest.raises(RiptError, match=r"wide.hdf5: cam_rgb has per-step shape \(8, 8, 3\) but .*t0.hdf5 has"):
        ChunkDataset(spec(files[:2] + [other], load_workers=2), "all")


def test_prefetched_training_batches_equal_the_inline_ones(tmp_path):
    from ript.data.dataset import training_batches

    files = [write_synthetic(tmp_path / "a.hdf5"), write_synthetic(tmp_path / "b.hdf5", lengths=(4, 6))]
    inline, served = ChunkDataset(spec(files), "all"), ChunkDataset(spec(files), "all").serve_to("cpu")
    assert served.served and not inline.served
    for start, steps in ((0, 7), (5, 9), (3, 3)):
        a = list(training_batches(inline, 4, 0, start, steps, slice(1, 3)))
        b = list(training_batches(served, 4, 0, start, steps, slice(1, 3)))  # gathered one batch ahead
        assert [s for s, _, _ in a] == [s for s, _, _ in b] == list(range(start, steps))
        for (_, ia, ba), (_, ib, bb) in zip(a, b):
            assert torch.equal(ia, ib) and torch.equal(ba["actions"], bb["actions"]) and len(ba["actions"]) == 2
            assert all(torch.equal(ba["obs"][k], bb["obs"][k]) for k in ba["obs"])
