"""The sampling noise of one batched decision, drawn from each env's own episode stream (``Policy.env_draws``):
its time on the GPU with the streams as CUDA generators (one small kernel or two per env) against the streams as CPU
generators whose draws go to the GPU in one copy. The shapes are the policies' own: the flow policy's initial and
step noise (K + 1 steps x chunk x action dims) and its stochastic step, and the QueST prior's Gumbel uniforms
(tokens x vocabulary).

    python -m benchmarks.noise_draws [--rows 16 64] [--repeats 200] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

SHAPES = {"flow K=4 chunk 8 (noise + step)": [(5, 8, 7), ()], "flow K=10 chunk 50 (noise + step)": [(11, 50, 32), ()],
          "quest 8 tokens x 1024": [(1, 8, 1024)]}


def draw_all(streams: list[torch.Generator], shapes: list[tuple], device: torch.device, pinned: bool = False
             ) -> list[torch.Tensor]:
    """Each shape drawn from every stream, stacked and on ``device``, as a decision's inputs are."""
    out = []
    for shape in shapes:
        on = streams[0].device
        if shape:
            rows = [torch.randn(shape, device=on, generator=g) for g in streams]
        else:
            rows = [torch.randint(0, 4, (), device=on, generator=g) for g in streams]
        stacked = torch.stack(rows)
        if on != device:
            stacked = (stacked.pin_memory() if pinned else stacked).to(device, non_blocking=pinned)
        out.append(stacked)
    return out


def time_draws(rows: int, shapes: list[tuple], stream_device: str, device: torch.device, repeats: int,
               pinned: bool = False) -> float:
    streams = [torch.Generator(device=stream_device).manual_seed(i) for i in range(rows)]
    for _ in range(5):
        draw_all(streams, shapes, device, pinned)
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        draw_all(streams, shapes, device, pinned)
    torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) / repeats * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device("cuda")
    results = []
    for name, shapes in SHAPES.items():
        for rows in args.rows:
            gpu = time_draws(rows, shapes, "cuda", device, args.repeats)
            cpu = time_draws(rows, shapes, "cpu", device, args.repeats)
            pinned = time_draws(rows, shapes, "cpu", device, args.repeats, pinned=True)
            results.append({"shapes": name, "rows": rows, "cuda_streams_ms": round(gpu, 3),
                            "cpu_streams_ms": round(cpu, 3), "cpu_streams_pinned_ms": round(pinned, 3)})
            print(f"{name:36s} rows {rows:3d}: CUDA streams {gpu:7.3f} ms, CPU streams + one copy {cpu:7.3f} ms "
                  f"(pinned {pinned:7.3f})", flush=True)
    record = {"device": torch.cuda.get_device_name(device), "torch": torch.__version__, "cpu_threads":
              torch.get_num_threads(), "repeats": args.repeats, "results": results}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
