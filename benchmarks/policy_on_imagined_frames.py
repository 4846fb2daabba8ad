"""What a policy does on a world model's frames, against what it does on the real ones: where RL in imagination
parts from the simulator when the world model's open-loop fidelity looks good.

Along each episode of a folder (a policy's own, ``ript eval record_episodes=true``; or the world model's held-out
demos), from its first real frame, the policy decides on six streams of observations with the same noise (one
episode key for all six, so that only the frames differ):

- ``real``: the episode's recorded frames, after its recorded actions;
- ``imagined``: the world model's frames after the same recorded actions (open loop: the model's error alone);
- ``closed_loop``: the world model's frames after the policy's own actions on them, as RL and an imagined
  evaluation run it;
- ``still``: the first frame held (what the policy does when nothing it reads moves);
- ``imagined_cameras`` and ``imagined_state``: the imagined stream's cameras with the real robot state, and the
  real cameras with the imagined state: which of the two the policy's difference on imagined frames comes from;
- ``imagined_<camera>`` for each camera of a model with more than one: that camera imagined, everything else real
  (which camera it is).

Per decision of the horizon: the root mean square difference of each stream's chunk from the ``real`` one (the
world model's normalised action units), the share of gripper commands of the same sign, and for the closed loop
the imagined and closed-loop robot state's and frames' distance from the real ones. ``recorded`` is the real
stream's chunk against the actions the episode executed: for a sampling policy, the spread of its own sampling (the
episode drew other noise), the scale the other rows compare to; with deterministic decoding 0 up to the arithmetic
of the host that recorded it. On the policy's own episodes with deterministic decoding a perfect world model gives
0 on the imagined and closed-loop rows; with a sampling policy the closed loop also drifts by what its draws differ.

    python -m benchmarks.policy_on_imagined_frames --world-model runs/x/world_model_head --policy runs/x/flow \
        --episodes-dir runs/x/eval/episodes --horizon-chunks 12 --out results.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from benchmarks.results_file import write_or_print
from ript.config import compose, extra_data_files, override
from ript.evaluation.imagination import demo_dataset, images_of, psnr, state_rmse
from ript.model_loader import load_model
from ript.policies.families import checkpoint_model, family_for
from ript.registry import POLICIES
from ript.utils.device import resolve_device
from ript.utils.video import write_mp4

STREAMS = ("real", "imagined", "closed_loop", "still", "imagined_cameras", "imagined_state")


def cameras_alone(model) -> list[str]:
    """The cameras imagined one at a time, each in a stream of its own: all of a model's, when it has several."""
    return list(model.image_keys) if len(model.image_keys) > 1 else []


def streams_of(model) -> tuple[str, ...]:
    """``STREAMS`` and one ``imagined_<camera>`` stream per camera of ``cameras_alone``."""
    return STREAMS + tuple(f"imagined_{k}" for k in cameras_alone(model))


def load_policy(checkpoint: str, device: str, seed: int, overrides: list[str] = ()):
    """The policy of ``checkpoint`` as ``ript eval`` decodes it with ``overrides`` (e.g. sampling.greedy=true)."""
    family = checkpoint_model(checkpoint)
    cfg = compose("eval", [*([f"policy={family}"] if family in POLICIES.names() else []),
                           override("checkpoint", checkpoint), f"device={device}", *overrides])
    return family_for(cfg).load(cfg, device, seed, rl=False)


def host(obs: dict[str, torch.Tensor], j: int) -> dict[str, np.ndarray]:
    return {k: v[j].cpu().numpy() for k, v in obs.items()}


class Sums:
    """Per-decision sums over live segments, averaged at the end."""

    def __init__(self, decisions: int):
        self.values: dict[str, np.ndarray] = {}
        self.n = np.zeros(decisions)

    def add(self, name: str, d: int, value: torch.Tensor, live: torch.Tensor) -> None:
        self.values.setdefault(name, np.zeros(len(self.n)))[d] += float(value[live].double().sum())

    def table(self) -> list[dict]:
        return [{"decision": d, "segments": int(self.n[d]),
                 **{k: float(v[d] / max(self.n[d], 1)) for k, v in self.values.items()}} for d in range(len(self.n))]


@torch.no_grad()
def measure(model, dataset, policy, starts: torch.Tensor, device: str, batch_size: int, n_videos: int = 0,
            video_dir: Path | None = None) -> list[dict]:
    """Each decision's comparisons of the streams (``streams_of``) over the episodes that start at ``starts`` (the first
    ``n_videos`` also as videos: real frames above, open-loop imagined in the middle, closed loop below)."""
    chunk, horizon = model.chunk, dataset.spec.future_count
    per_decision = policy.action_horizon // chunk  # world-model chunks per policy decision
    decisions = horizon // per_decision
    sums = Sums(decisions)
    norm, videos, cameras, streams = model.action_normalizer, 0, set(model.image_keys), streams_of(model)
    for i in range(0, len(starts), batch_size):
        segments = starts[i:i + batch_size]
        batch = dataset.get_batch(segments)
        b = len(segments)
        left = (dataset.episode_end[segments] - segments).to(device)
        task_ids, recorded = batch["task_ids"].to(device), batch["actions"].to(device)
        first = {k: v[:, 0].to(device) for k, v in batch["obs"].items() if k in model.image_keys + model.lowdim_keys}
        obs = {name: dict(first) for name in streams}
        policy.reset(len(streams) * b)
        for s in range(len(streams)):
            for j in range(b):  # one key per segment in every stream: the same noise, other frames
                policy.reset_env(s * b + j, model.task_names[int(task_ids[j])], int(segments[j]))
        frames: list[torch.Tensor] = []
        for d in range(decisions):
            obs["imagined_cameras"] = {k: (obs["imagined"] if k in cameras else obs["real"])[k] for k in first}
            obs["imagined_state"] = {k: (obs["real"] if k in cameras else obs["imagined"])[k] for k in first}
            for camera in cameras_alone(model):
                obs[f"imagined_{camera}"] = {k: (obs["imagined"] if k == camera else obs["real"])[k] for k in first}
            for s, name in enumerate(streams):
                for j in range(b):
                    policy.observe(s * b + j, host(obs[name], j))
            planned = policy.act_chunk([True] * (len(streams) * b))
            chunks = {name: torch.from_numpy(np.stack(planned[s * b:(s + 1) * b])).to(device)
                      for s, name in enumerate(streams)}
            live = d * policy.action_horizon < left
            sums.n[d] += float(live.sum())
            span = slice(d * policy.action_horizon, (d + 1) * policy.action_horizon)
            compare_chunks(sums, d, norm, chunks, recorded[:, span], live)
            images = {name: images_of(model, obs[name]) for name in ("real", "imagined", "closed_loop")}
            for name in ("imagined", "closed_loop"):
                sums.add(f"{name}_state_rmse", d, state_rmse(model, obs[name], obs["real"]), live)
                sums.add(f"{name}_psnr", d, psnr(images[name], images["real"]), live)
            if videos < n_videos:  # stacked: real, imagined, closed loop; the batch's videos only, on the host
                frames.append(torch.cat(list(images.values()), dim=2)[:n_videos - videos].byte().cpu())
            for c in range(per_decision):
                k = d * per_decision + c
                steps = slice(k * chunk, (k + 1) * chunk)
                obs["imagined"] = cast(model.step(obs["imagined"], task_ids, recorded[:, steps])[0], first)
                own = chunks["closed_loop"][:, c * chunk:(c + 1) * chunk]
                obs["closed_loop"] = cast(model.step(obs["closed_loop"], task_ids, own)[0], first)
            obs["real"] = {k: batch["future_obs"][k][:, (d + 1) * per_decision - 1].to(device) for k in first}
        for j in range(min(b, n_videos - videos)):
            shown = int((left[j] + policy.action_horizon - 1) // policy.action_horizon)  # decisions with real frames
            write_mp4(video_dir / f"episode{videos:03d}_real_imagined_closed_loop.mp4",
                      [f[j].permute(1, 2, 0).numpy() for f in frames[:max(1, shown)]], fps=4)
            videos += 1
    return sums.table()


def cast(predicted: dict[str, torch.Tensor], like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model's next observation in the dtypes of the real ones (what the simulator hands the policy)."""
    return {k: predicted[k].to(v.dtype) for k, v in like.items()}


def compare_chunks(sums: Sums, d: int, norm, chunks: dict[str, torch.Tensor], recorded: torch.Tensor,
                   live: torch.Tensor) -> None:
    real = norm.normalize(chunks["real"].float())
    others = {name: chunk for name, chunk in chunks.items() if name != "real"}
    others["recorded"] = recorded[:, :real.shape[1]]
    for name, chunk in others.items():
        moved = norm.normalize(chunk.float())
        sums.add(f"{name}_action_rmse", d, (moved - real).pow(2).mean(dim=(1, 2)).sqrt(), live)
        same = (torch.sign(chunk[..., -1]) == torch.sign(chunks["real"][..., -1])).float().mean(1)
        sums.add(f"{name}_gripper_agreement", d, same, live)


def print_table(rows: list[dict], cameras: list[str]) -> None:
    """The rows, then each camera of ``cameras`` imagined alone."""
    print("decision  action RMSE vs real: recorded imagined (cameras state) closed-loop still  gripper agree: "
          "imagined closed  state RMSE: imagined closed  PSNR: imagined closed  segments")
    for r in rows:
        print(f"{r['decision']:>8}  {r['recorded_action_rmse']:>27.3f} {r['imagined_action_rmse']:>8.3f} "
              f"({r['imagined_cameras_action_rmse']:.3f} {r['imagined_state_action_rmse']:.3f}) "
              f"{r['closed_loop_action_rmse']:>11.3f} {r['still_action_rmse']:>5.3f}  "
              f"{100 * r['imagined_gripper_agreement']:>22.1f}% {100 * r['closed_loop_gripper_agreement']:>5.1f}%  "
              f"{r['imagined_state_rmse']:>20.3f} {r['closed_loop_state_rmse']:>6.3f}  {r['imagined_psnr']:>14.2f} "
              f"{r['closed_loop_psnr']:>6.2f}  "
              f"{r['segments']:>8}")
    if cameras:
        print("decision  one camera imagined, the rest real: action RMSE vs real, gripper agreement: "
              + "  ".join(cameras))
        for r in rows:
            print(f"{r['decision']:>8}  " + "  ".join(
                f"{k}: {r[f'imagined_{k}_action_rmse']:.3f} {100 * r[f'imagined_{k}_gripper_agreement']:.1f}%"
                for k in cameras))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-model", required=True)
    p.add_argument("--policy", required=True, help="a policy checkpoint of the world model's tasks")
    p.add_argument("--policy-overrides", nargs="*", default=[],
                   help="`ript eval` overrides of its decoding, as the episodes were recorded (sampling.greedy=true)")
    p.add_argument("--episodes-dir", default=None, help="<task>.hdf5 episodes (default: the model's held-out demos)")
    p.add_argument("--horizon-chunks", type=int, default=12, help="world-model chunks imagined from each start")
    p.add_argument("--max-episodes", type=int, default=200, help="the first episodes of the folder, at most")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-videos", type=int, default=4, help="episodes written as videos beside --out")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    device = resolve_device(args.device)
    torch.manual_seed(args.seed)
    model, config = load_model(args.world_model, expect_stage="world_model", device=device)
    model.eval()
    loaded = load_policy(args.policy, device, args.seed, args.policy_overrides)
    files = extra_data_files(list(model.task_names), [args.episodes_dir], "--episodes-dir") if args.episodes_dir \
        else None
    dataset = demo_dataset(config, args.horizon_chunks, "all" if files else "val", files)
    dataset.to(device)
    starts = dataset.episode_start.unique()[:args.max_episodes]
    video_dir = Path(args.out).with_suffix("") if args.out else Path("policy_on_imagined_frames")
    rows = measure(model, dataset, loaded.policy, starts, device, args.batch_size, args.n_videos, video_dir)
    print_table(rows, cameras_alone(model))
    write_or_print({"measures": __doc__.split("\n")[0], "world_model": args.world_model, "policy": args.policy,
                    "policy_overrides": args.policy_overrides,
                    "episodes_dir": args.episodes_dir, "episodes": int(len(starts)),
                    "policy_actions_per_decision": loaded.policy.action_horizon, "world_model_chunk": model.chunk,
                    "decisions": rows}, args.out)


if __name__ == "__main__":
    main()
