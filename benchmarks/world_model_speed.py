"""The world model's speed at a suite's size with random weights (speed does not depend on them): imagined env
steps/s for batches of envs stepping whole chunks, and training samples/s of the unrolled loss (bf16 autocast and
AdamW on a GPU). Compare the env steps/s with the simulator's floor on the same host
(``benchmarks.libero_step_speed``) and the samples/s with the steps a training run takes.

    python -m benchmarks.world_model_speed --envs 64,256,1024 --out benchmarks/results/<file>.json
    python -m benchmarks.world_model_speed --width 32 --output warp_diffusion --envs 64,256 --out <file>.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from ript.evaluation.imagination import synchronize, timed_steps
from ript.models.world_model import WorldModel
from ript.utils.atomic import atomic_write_text

LIBERO_STATE = {"ee_states": 6, "gripper_states": 2, "joint_states": 7}


def build(args, device: str) -> WorldModel:
    torch.manual_seed(0)
    model = WorldModel([f"task{i}" for i in range(10)], ["agentview_rgb", "eye_in_hand_rgb"], LIBERO_STATE,
                       args.image_size, 7, args.chunk, lang_dim=384, width=args.width, stages=args.stages,
                       cond_dim=args.cond_dim, output=args.output, denoise_steps=args.denoise_steps)
    return model.to(device)


def observations(n: int, size: int, device: str, frames: int | None = None) -> dict[str, torch.Tensor]:
    lead = (n,) if frames is None else (n, frames)
    obs = {k: torch.randint(0, 256, (*lead, size, size, 3), dtype=torch.uint8, device=device)
           for k in ("agentview_rgb", "eye_in_hand_rgb")}
    obs.update({k: torch.randn(*lead, d, device=device) for k, d in LIBERO_STATE.items()})
    return obs


def imagined_rate(model: WorldModel, envs: int, chunks: int, device: str) -> dict[str, float]:
    model.eval()
    obs = observations(envs, model.image_size, device)
    task_ids = torch.arange(envs, device=device) % 10
    actions = torch.rand(envs, model.chunk, 7, device=device) * 2 - 1
    return timed_steps(model, obs, task_ids, actions, chunks, device, warmup=3)


def training_rate(model: WorldModel, batch: int, unroll: int, steps: int, device: str) -> dict[str, float]:
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    obs = observations(batch, model.image_size, device, frames=1)
    future = observations(batch, model.image_size, device, frames=unroll)
    done = torch.zeros(batch, unroll, dtype=torch.bool, device=device)
    actions = torch.rand(batch, unroll * model.chunk, 7, device=device) * 2 - 1
    task_ids = torch.arange(batch, device=device) % 10
    generator = torch.Generator(device=device).manual_seed(0)

    def step() -> None:
        draws = model.diffusion_draws(batch, unroll, torch.device(device), generator)  # None: a regressing output
        with torch.autocast("cuda", torch.bfloat16, enabled=device.startswith("cuda")):
            loss = model.loss(obs, future, done, actions, task_ids, draws)["loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None
    return {"batch": batch, "unroll": unroll, "samples_per_second": batch * steps / seconds,
            "steps_per_second": steps / seconds, "peak_gib": peak}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--envs", default="64,256,1024")
    p.add_argument("--chunks", type=int, default=20)
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--chunk", type=int, default=4)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--stages", type=int, default=3)
    p.add_argument("--cond-dim", type=int, default=256)
    p.add_argument("--output", default="change", help="algo.model.output: change, warp, diffusion, warp_diffusion")
    p.add_argument("--denoise-steps", type=int, default=1, help="network calls per chunk of a denoising output")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--unroll", type=int, default=3)
    p.add_argument("--train-steps", type=int, default=20)
    p.add_argument("--channels-last", action="store_true",
                   help="the convolutions' weights in channels-last memory (cuDNN's fastest bf16 layout)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cudnn.benchmark = True
    model = build(args, device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    params = sum(q.numel() for q in model.parameters()) / 1e6
    result = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "parameters_millions": params,
              "settings": vars(args) | {"out": None},
              "imagined": [imagined_rate(model, int(n), args.chunks, device) for n in args.envs.split(",")],
              "training": training_rate(model, args.batch, args.unroll, args.train_steps, device)}
    print(json.dumps(result, indent=2))
    if args.out is not None:
        atomic_write_text(Path(args.out), json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
