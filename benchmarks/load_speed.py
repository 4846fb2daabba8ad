"""Dataset loading speed: a task's demonstration files read into memory by 1 and by N processes.

    python -m benchmarks.load_speed task=metaworld_ml45 --workers 1,16
Prints seconds, GB/s of decompressed data and the speed-up; the floor is N x one process's rate.
"""
from __future__ import annotations

import argparse
import time

from ript.config import compose, data_files
from ript.data.dataset import ChunkDataset, DatasetSpec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("overrides", nargs="*", help="hydra overrides of the stage-1 config, e.g. task=metaworld_ml45")
    ap.add_argument("--workers", default="1,2")
    args = ap.parse_args()
    cfg = compose("stage1", args.overrides)
    files = data_files(cfg.task)
    rates = {}
    for w in (int(x) for x in args.workers.split(",")):
        spec = DatasetSpec(files, dict(cfg.task.obs_keys), int(cfg.algo.chunk_size), val_fraction=0.0,
                           load_workers=w)
        t0 = time.perf_counter()
        ds = ChunkDataset(spec, "all")
        seconds = time.perf_counter() - t0
        rates[w] = ds.nbytes / seconds
        print(f"workers {w:>3}: {seconds:7.2f} s for {ds.nbytes / 1e9:6.2f} GB ({len(files)} files) = "
              f"{rates[w] / 1e9:5.2f} GB/s, x{rates[w] / rates[min(rates)]:.2f} of {min(rates)} process(es)")
        del ds


if __name__ == "__main__":
    main()
