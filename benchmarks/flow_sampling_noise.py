"""What RL's noise costs a flow policy: success of the sampled denoising chain (as RL's rollouts draw it) against
the ODE's (as evaluation runs it), for each noise setting, on the same episodes.

    python -m benchmarks.flow_sampling_noise --checkpoint <flow run> [--episodes 10] [--out <file.json>]
        [--variants "ode" "sde0.5 policy.noise_level=0.5" ...] [--overrides key=value ...]

Each variant is the checkpoint through ``ript eval`` with its overrides (every variant whose tag does not start
with ``ode`` samples: ``sampling.greedy=false``), on the same seeds, so the per-episode outcomes pair up: the
results count the episodes the ODE solved and the variant failed, and the reverse. A lost success here is a
rollout RL starts from a worse policy than the one it is judged by. ODE variants compare the ODE's own settings,
e.g. the denoise-step count:

    python -m benchmarks.flow_sampling_noise --checkpoint <flow run> --variants ode "ode_k1 policy.denoise_steps=1"
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchmarks.results_file import write_or_print
from ript.config import compose
from ript.stages import evaluate

DEFAULT_VARIANTS = (
    "ode",
    "sde0.5 policy.noise_method=flow_sde policy.noise_level=0.5",
    "sde0.3 policy.noise_method=flow_sde policy.noise_level=0.3",
    "sde0.2 policy.noise_method=flow_sde policy.noise_level=0.2",
    "sde0.1 policy.noise_method=flow_sde policy.noise_level=0.1",
    "sde0.5_all_steps policy.noise_method=flow_sde policy.noise_level=0.5 policy.sde_steps=all",
    "noise_head policy.noise_method=flow_noise",
)


def outcomes(results: dict) -> dict[tuple[str, int], bool]:
    """Each episode's success, by (task, seed)."""
    return {(e["task"], int(e["seed"])): bool(e["success"]) for e in results["episodes"]}


def one_variant(checkpoint: str, variant: str, episodes: int, overrides: list[str], out_dir: Path) -> dict:
    tag, *settings = variant.split()
    sampled = [] if tag.startswith("ode") else ["sampling.greedy=false"]
    cfg = compose("eval", [f"checkpoint={checkpoint}", "policy=flow", f"episodes_per_task={episodes}",
                           f"out_dir={out_dir / tag}", "n_videos=0", *sampled, *settings, *overrides])
    results = evaluate.run(cfg)
    return {"variant": tag, "overrides": settings + sampled, "success_rate": results["success_rate"],
            "per_task": results["per_task"], "env_steps_per_second": results["env_steps_per_second"],
            "policy_share": results["policy_share"], "outcomes": outcomes(results)}


def paired(row: dict, ode: dict) -> dict:
    """The variant's episodes against the ODE's on the same seeds."""
    shared = row["outcomes"].keys() & ode["outcomes"].keys()
    return {"episodes": len(shared),
            "ode_only": sum(ode["outcomes"][k] and not row["outcomes"][k] for k in shared),
            "variant_only": sum(row["outcomes"][k] and not ode["outcomes"][k] for k in shared)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--episodes", type=int, default=10, help="per task")
    ap.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS),
                    help="'tag override...'; the tag ode runs the ODE and is the reference, other tags starting "
                         "with ode run the ODE with their overrides")
    ap.add_argument("--overrides", nargs="*", default=[], help="more `ript eval` settings for every variant")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    variants = args.variants if args.variants[0].split()[0] == "ode" else ["ode", *args.variants]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for v in variants:
            rows.append(one_variant(args.checkpoint, v, args.episodes, args.overrides, Path(tmp)))
            pair = paired(rows[-1], rows[0])
            rows[-1].update(pair)
            print(f"{rows[-1]['variant']:>18}  success {100 * rows[-1]['success_rate']:5.1f}%  solved by the ODE "
                  f"only {pair['ode_only']}, by this only {pair['variant_only']} of {pair['episodes']}", flush=True)
    for row in rows:
        row.pop("outcomes")
    write_or_print({"checkpoint": args.checkpoint, "episodes_per_task": args.episodes, "overrides": args.overrides,
                    "rows": rows}, args.out)


if __name__ == "__main__":
    main()
