"""How long a round of recorded episodes takes to come back from a rollout actor to its trainer through Ray, as the
decisions are recorded (several small tensors each) and packed (``ript.rl.episode_transfer``: one tensor per field
and episode). The decisions have the chunk policy's shapes at the protocol's size (context of 4 tokens x 256,
5 skill tokens and their log-probs) and sit on the actor's GPU where there is one, as in
``placement.mode=disaggregated``.

    python -m benchmarks.episode_transfer [--episodes 256] [--decisions 100] [--repeats 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from ript.rl.episode_transfer import pack_episodes, unpack_episodes
from ript.utils.atomic import atomic_write_text


def recorded_round(episodes: int, decisions: int, device: str) -> dict:
    g = torch.Generator(device=device).manual_seed(0)

    def decision() -> dict:
        return {"context": torch.randn(4, 256, device=device, generator=g),
                "tokens": torch.randint(0, 1024, (5,), device=device, generator=g),
                "log_probs": torch.randn(5, device=device, generator=g)}

    return {"episodes": [{"task": "reach-v3", "episode": e, "seed": e, "success": True, "length": 2 * decisions,
                          "decisions": [decision() for _ in range(decisions)], "chunk_rewards": [0.0] * decisions}
                         for e in range(episodes)]}


class Sender:
    def __init__(self, episodes: int, decisions: int):
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.results = recorded_round(episodes, decisions, device)

    def send(self, packed: bool) -> dict:
        return pack_episodes(self.results) if packed else self.results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=256)
    ap.add_argument("--decisions", type=int, default=100, help="per episode (200 steps at action horizon 2)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out")
    a = ap.parse_args()
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    gpus = 1 if torch.cuda.is_available() else 0
    ray.init(num_cpus=2, num_gpus=gpus, include_dashboard=False, log_to_driver=False)
    device = "cuda" if gpus else "cpu"
    sender = ray.remote(num_cpus=1, num_gpus=gpus)(Sender).remote(a.episodes, a.decisions)
    rows = {}
    for packed in (False, True):
        seconds = []
        for _ in range(a.repeats):
            start = time.perf_counter()
            received = ray.get(sender.send.remote(packed))
            if packed:
                unpack_episodes(received, device)
            seconds.append(time.perf_counter() - start)
        # the tensors that crossed: each decision's, or each episode's stacked fields
        tensors = sum(len(e["packed_decisions"]["stacked"]) for e in received["episodes"]) if packed \
            else sum(len(d) for e in received["episodes"] for d in e["decisions"])
        rows["packed" if packed else "as recorded"] = {"seconds": min(seconds), "tensors_per_round": tensors}
        print(f"{'packed' if packed else 'as recorded'}: {min(seconds):.2f} s", flush=True)
    ray.shutdown()
    result = {"device": torch.cuda.get_device_name(0) if gpus else f"CPU, {os.cpu_count()} cores",
              "episodes": a.episodes, "decisions_per_episode": a.decisions, "rows": rows}
    print(json.dumps(result))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(a.out), json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
