"""How well a suite's robot state after a chunk of actions follows from the state, the actions and the task alone:
the floor a world model's state prediction can be held to (its state RMSE in ``ript world-model-eval``, in the same
units: each dimension normalised by its mean and standard deviation over the demos).

On a sixth of the demos held out, per chunk: no change (the state held), a linear map, and a small network (three
layers, as ``algo.model.state_head=dynamics``) trained for ``--steps`` batches of ``--batch`` chunks; then the
network fed its own predictions over ``--horizon`` chunks from points along each held-out demo. One file per task
(``ript collect``'s ``<task>_demo.hdf5``), the keys the policy reads:

    python -m benchmarks.state_predictability --data "data/libero/libero_object/*_demo.hdf5" \\
        --keys ee_states,gripper_states,joint_states --steps 400 --batch 48 --out runs/state_predictability.json
"""

from __future__ import annotations

import argparse
import glob
import json
from pathlib import Path

import h5py
import numpy as np
import torch
from torch import nn

from ript.utils.atomic import atomic_write_text


def load_demos(pattern: str, keys: list[str], action_key: str) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(task index, states (T, S), actions (T, A)) of every demo of every file ``pattern`` matches."""
    files = sorted(glob.glob(pattern))
    if not files:
        raise SystemExit(f"--data {pattern}: no files")
    demos = []
    for task, name in enumerate(files):
        with h5py.File(name, "r") as f:
            for demo in f["data"].values():
                missing = [k for k in keys if f"obs/{k}" not in demo]
                if missing:
                    raise SystemExit(f"{name}: no obs/{missing[0]} (--keys)")
                state = np.concatenate([demo[f"obs/{k}"][:] for k in keys], axis=-1).astype(np.float32)
                demos.append((task, state, demo[action_key][:].astype(np.float32)))
    return demos


class Chunks:
    """The demos' (state, chunk of actions, task) -> next state's change, in normalised units."""

    def __init__(self, demos, chunk: int):
        states, actions = np.concatenate([d[1] for d in demos]), np.concatenate([d[2] for d in demos])
        self.mean, self.std = states.mean(0), states.std(0) + 1e-6
        self.low, self.high = actions.min(0), actions.max(0)
        self.chunk, self.tasks = chunk, 1 + max(d[0] for d in demos)

    def state(self, s: np.ndarray) -> np.ndarray:
        return (s - self.mean) / self.std

    def inputs(self, task: int, state: np.ndarray, actions: np.ndarray) -> np.ndarray:
        scaled = 2 * (actions - self.low) / np.maximum(self.high - self.low, 1e-6) - 1
        return np.concatenate([state, scaled.ravel(), np.eye(self.tasks, dtype=np.float32)[task]])

    def samples(self, demos) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = [], []
        for task, s, a in demos:
            for t in range(len(s) - self.chunk):
                x.append(self.inputs(task, self.state(s[t]), a[t:t + self.chunk]))
                y.append(self.state(s[t + self.chunk]) - self.state(s[t]))
        return torch.tensor(np.array(x)), torch.tensor(np.array(y))


def rmse(predicted: torch.Tensor, target: torch.Tensor) -> float:
    return float((predicted - target).pow(2).mean().sqrt())


def fit_linear(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    xb = torch.cat([x, torch.ones(len(x), 1)], 1)
    return torch.linalg.solve(xb.T @ xb + 1e-3 * torch.eye(xb.shape[1]), xb.T @ y)


def fit_network(x: torch.Tensor, y: torch.Tensor, steps: int, batch: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    width = 256
    net = nn.Sequential(nn.Linear(x.shape[1], width), nn.SiLU(), nn.Linear(width, width), nn.SiLU(),
                        nn.Linear(width, y.shape[1]))
    opt = torch.optim.AdamW(net.parameters(), 1e-3, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(len(x), (batch,), generator=g)
        loss = (net(x[idx]) - y[idx]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
    return net


@torch.no_grad()
def fed_back(net: nn.Module, chunks: Chunks, demos, horizon: int) -> list[float]:
    """The network's state RMSE after 1..horizon chunks, each from its own last prediction, from every
    ``horizon``-th point along each demo."""
    errors, counted = np.zeros(horizon), 0
    k = chunks.chunk
    for task, s, a in demos:
        for start in range(0, len(s) - horizon * k, horizon):
            state = torch.tensor(chunks.state(s[start]))
            for c in range(horizon):
                x = torch.tensor(chunks.inputs(task, state.numpy(), a[start + c * k:start + (c + 1) * k]))
                state = state + net(x[None])[0]
                errors[c] += float((state - torch.tensor(chunks.state(s[start + (c + 1) * k]))).pow(2).mean())
            counted += 1
    return [float(e) for e in np.sqrt(errors / max(counted, 1))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a glob of demonstration files, one per task")
    p.add_argument("--keys", required=True, help="comma-separated low-dim observation keys, in the policy's order")
    p.add_argument("--action-key", default="actions")
    p.add_argument("--chunk", type=int, default=4)
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--horizon", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    demos = load_demos(args.data, args.keys.split(","), args.action_key)
    held_out = set(np.random.default_rng(args.seed).choice(len(demos), max(len(demos) // 6, 1), replace=False))
    train = [d for i, d in enumerate(demos) if i not in held_out]
    val = [d for i, d in enumerate(demos) if i in held_out]
    chunks = Chunks(train, args.chunk)
    (x, y), (vx, vy) = chunks.samples(train), chunks.samples(val)
    w = fit_linear(x, y)
    net = fit_network(x, y, args.steps, args.batch, args.seed)
    with torch.no_grad():
        result = {"no_change": rmse(torch.zeros_like(vy), vy),
                  "linear": rmse(torch.cat([vx, torch.ones(len(vx), 1)], 1) @ w, vy),
                  "network": rmse(net(vx), vy)}
    result["network_fed_back"] = fed_back(net, chunks, val, args.horizon)
    out = {"measures": "state RMSE after one chunk on held-out demos (normalised units) with no change, a linear "
                       "map and a small network; the network fed back over chunks", "args": vars(args),
           "demos": {"train": len(train), "held_out": len(val)}, "samples_seen": args.steps * args.batch, **result}
    print(json.dumps({k: v for k, v in out.items() if k not in ("measures", "args")}, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(args.out), json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
