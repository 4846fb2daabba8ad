"""How fast the trainer's weights reach a rollout actor (``ript.utils.weight_sync.WeightChannel``): two processes,
the sender on GPU 0 and the receiver on GPU 1 (or both on the CPU), a model of each size in ``--params`` (bf16
linear layers of 4096 x 4096, as a VLA's), timed over gloo (through host memory) and NCCL (GPU to GPU). The floor
is the link between the two GPUs (``--link-gbps``: NVLink 4 on an H100 SXM host moves ~450 GB/s each way).

    python -m benchmarks.weight_channel [--params 3e7,1e9,7.5e9] [--backends gloo,nccl] [--repeats 3] [--out f.json]
    python -m benchmarks.weight_channel --cpu --params 1e7 --backends gloo   # the script itself, on the CPU
"""

from __future__ import annotations

import argparse
import json
import socket
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ript.utils.atomic import atomic_write_text
from ript.utils.weight_sync import WeightChannel

WIDTH = 4096


def layers(params: float, device: str) -> torch.nn.Module:
    """Linear weights of WIDTH x WIDTH in bf16 (the last one narrower) adding up to ``params``."""
    count, rest = divmod(int(params), WIDTH * WIDTH)
    shapes = [(WIDTH, WIDTH)] * count + ([(max(1, rest // WIDTH), WIDTH)] if rest >= WIDTH else [])
    return torch.nn.ParameterList([torch.nn.Parameter(torch.randn(s, dtype=torch.bfloat16, device=device))
                                   for s in shapes])


def side(rank: int, port: int, sizes: list[float], backends: list[str], repeats: int, cpu: bool, results) -> None:
    device = "cpu" if cpu else f"cuda:{rank}"
    if not cpu:
        torch.cuda.set_device(rank)
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=timedelta(seconds=120))
    rows = []
    for backend in backends:
        channel = WeightChannel(store, rank, 120, backend, device)
        for params in sizes:
            model = layers(params, device)
            channel.transfer(model)  # the signature check and the communicator's start
            seconds = []
            for _ in range(repeats):
                start = time.perf_counter()
                sent = channel.transfer(model)
                seconds.append(time.perf_counter() - start)
            rows.append({"backend": backend, "params": sum(p.numel() for p in model), "bytes": sent,
                         "seconds": min(seconds), "gb_per_s": sent / min(seconds) / 1e9})
            del model
    if rank == 1:
        results.put(rows)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="3e7,1e9,7.5e9")
    ap.add_argument("--backends", default="gloo,nccl")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--link-gbps", type=float, default=450.0, help="the GPU-to-GPU link's bandwidth, GB/s")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args()
    sizes = [float(p) for p in a.params.split(",")]
    backends = a.backends.split(",")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=side, args=(r, port, sizes, backends, a.repeats, a.cpu, results)) for r in (0, 1)]
    for p in procs:
        p.start()
    rows = results.get(timeout=1800)
    for p in procs:
        p.join(60)
    for row in rows:
        row["of_link"] = row["gb_per_s"] / a.link_gbps
        print(f"{row['backend']:>5} {row['params'] / 1e6:8.0f}M params {row['bytes'] / 1e9:6.2f} GB "
              f"{row['seconds']:7.3f} s {row['gb_per_s']:7.1f} GB/s ({row['of_link']:.2f} of the link)", flush=True)
    if a.out:
        host = "cpu" if a.cpu else torch.cuda.get_device_name(0)
        atomic_write_text(Path(a.out), json.dumps({"host": host, "link_gbps": a.link_gbps, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
