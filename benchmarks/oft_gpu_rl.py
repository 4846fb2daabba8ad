"""One RL iteration of OpenVLA-OFT (or the original OpenVLA) at full 7B size on MetaWorld: real rollouts
through the env runner, then the RL stage's PPO update over every recorded decision. Random weights in the
official layout, written here for a MetaWorld-shaped head (4-d actions, 4-d proprio for OFT, one camera);
none is shipped.

    python -m benchmarks.oft_gpu_rl --folder /tmp/oft7b_mw --groups 4 --k 8 --steps 96 [--out results.json]
    python -m benchmarks.oft_gpu_rl --model openvla --advantage gae --folder /tmp/openvla7b_mw --steps 24

With random weights the rewards carry no signal and dynamic sampling would keep no group, so the update
runs on all groups: with ``--advantage rloo`` their leave-one-out advantages, or a fixed +-1 pattern when every
reward is equal; with ``gae`` PPO with the value head on MetaWorld's dense reward (the critic's parameter group
and its forward included). Time and memory do not depend on the advantage values.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from ript.config import compose
from ript.envs.runner import EnvRunner, RunnerOptions
from ript.envs.seeds import rl_layout_seed
from ript.envs.worker_env import EpisodeSpec
from ript.models.openvla_oft.lora import add_lora
from ript.policies.families import family_for
from ript.rl.advantages import GAE, rloo
from ript.rl.learners import OFTLearner, OpenVLALearner
from ript.rl.rollout import group_episodes
from ript.rl.update import (
    epoch_orders,
    make_optimizer,
    minibatches,
    ppo_update,
    rescore,
    update_batch,
)
from ript.utils import training
from ript.utils.atomic import atomic_write_text
from ript.utils.distributed import DistInfo
from tests.helpers.official_checkpoints import (
    LLAMA2_7B,
    TINY_TEXT,
    TINY_VISION,
    official_config,
    write_official_checkpoint,
)

TASKS = ["reach-v3", "button-press-v3"]


def write_checkpoint(a, cuda: bool, discrete: bool) -> float:
    """Random weights in the official layout at ``a.folder`` (7B, or tiny with ``--tiny``): seconds taken."""
    t = time.perf_counter()
    config = official_config(TINY_TEXT, image_size=28, vision_overrides=TINY_VISION) if a.tiny \
        else official_config(LLAMA2_7B)
    if discrete and a.tiny:
        config["n_action_bins"] = 16
    # OpenVLA's action tokens are the tokenizer's last ids: the stand-in tokenizer needs enough of them
    filler = [f"w{i}" for i in range(300)] if discrete and not a.tiny else []
    write_official_checkpoint(a.folder, config, "metaworld", device=a.device,
                              dtype=torch.bfloat16 if cuda else torch.float32, action_dim=4,
                              proprio_dim=None if discrete else 4, oft_components=not discrete,
                              words="reach the goal press button".split() + filler)
    return time.perf_counter() - t


def rl_config(a, discrete: bool):
    return compose("oft", [f"checkpoint={a.folder}", "task=metaworld_ml45", f"task.task_names=[{','.join(TASKS)}]",
                           "task.render.cameras=[corner]", "policy.image_keys=[corner_rgb]",
                           f"policy.proprio_keys=[{'' if discrete else 'robot_states'}]", "policy.gripper=none",
                           "policy.center_crop=false", f"rl.rollouts_per_group={a.k}", f"device={a.device}",
                           f"rl.advantage={a.advantage}", "rl.reward_scale=0.01",
                           f"rl.reward={'dense' if a.advantage == 'gae' else 'sparse'}",
                           "rl.recompute_old_log_probs=false"])  # rescored below, after measuring the gap


def load_learner(cfg, a, cuda: bool, discrete: bool, res: dict):
    """The model with LoRA (and OFT's scale head), its learner attached to the policy: (learner, policy, loaded)."""
    t = time.perf_counter()
    loaded = family_for(cfg).load(cfg, a.device, 0, rl=True)
    model, policy = loaded.model, loaded.policy
    res["load_s"] = time.perf_counter() - t
    add_lora(model, cfg.policy.lora)
    critic_cfg = cfg.rl.critic if a.advantage == "gae" else None
    if discrete:
        learner = OpenVLALearner(model, bool(cfg.policy.gradient_checkpointing) and cuda, critic_cfg)
    else:
        p = next(model.action_head.parameters())
        model.add_scale_head(int(cfg.policy.scale_head_hidden),
                             float(cfg.policy.init_scale)).to(p.device, torch.float32)
        learner = OFTLearner(model, bool(cfg.policy.gradient_checkpointing) and cuda, False, critic_cfg)
    learner.attach(policy)
    res["trainable_m"] = sum(q.numel() for q in learner.params) / 1e6
    if learner.critic is not None:
        res["critic_m"] = sum(q.numel() for q in learner.critic.parameters()) / 1e6
    return learner, policy, loaded


def roll_out(a, policy, loaded, res: dict) -> list[dict]:
    """``a.groups`` groups of ``a.k`` episodes through the env runner, after a warm-up round: the episodes."""
    policy.start_recording()
    runner = EnvRunner(RunnerOptions("metaworld", loaded.task_names, loaded.metadata["env_args"]["render"], a.steps,
                                     episodes_per_task=1, num_workers=a.workers, episodes_at_once=a.groups * a.k))
    specs = [EpisodeSpec(TASKS[g % len(TASKS)], rl_layout_seed(g), g * a.k + j) for g in range(a.groups)
             for j in range(a.k)]
    try:
        runner.run(policy, specs=specs[: a.workers])  # warm-up: worker start, task builds, kernels
        policy.inference_seconds = 0.0
        t = time.perf_counter()
        eps = runner.run(policy, specs=specs)["episodes"]
        res["rollout_s"] = time.perf_counter() - t
    finally:
        runner.close()
    res["env_steps"] = sum(e["length"] for e in eps)
    res["inference_s"] = policy.inference_seconds
    res["inference_share"] = policy.inference_seconds / res["rollout_s"]
    res["rollout_success"] = sum(e["success"] for e in eps) / len(eps)
    return eps


def update_data(learner, eps: list[dict], cfg, a) -> dict:
    """Every group's decisions with their advantages (a fixed +-1 pattern where random weights leave every reward
    equal)."""
    groups = group_episodes(eps, a.k)
    if a.advantage == "gae":
        return update_batch(learner, groups, GAE(cfg.rl), cfg, a.device, DistInfo())[0]
    adv = rloo(torch.tensor([[float(e["success"]) for e in g] for g in groups]))
    if not adv.any():
        adv = torch.tensor([1.0, -1.0]).repeat(a.k // 2 + 1)[: a.k].expand_as(adv)
    per_decision = [float(adv[g, j]) for g, group in enumerate(groups) for j, e in enumerate(group)
                    for _ in e["decisions"]]
    data = learner.collate([d for g in groups for e in g for d in e["decisions"]], a.device)
    data["advantages"] = torch.tensor(per_decision, device=a.device)
    return data


def step0_gaps(learner, data: dict, cfg, a, res: dict) -> torch.Tensor:
    """Step 0, before any update: the log-probs PPO's first epoch computes (its shuffled micro-batches) against
    those recorded while sampling, those rescored in order, and those rescored in the first epoch's micro-batches
    (what rl.recompute_old_log_probs does); returns the last, which the update then takes as its old log-probs."""
    order = epoch_orders(len(data["advantages"]), cfg, 0)[0]  # the first epoch's, as ppo_update draws it
    in_order = rescore(learner, data, cfg, a.device)
    t = time.perf_counter()
    rescored = rescore(learner, data, cfg, a.device, order)
    res["rescore_s"] = time.perf_counter() - t
    step0 = torch.empty_like(rescored)
    with torch.no_grad(), training.autocast(a.device, cfg.amp):
        for _, parts in minibatches(order, int(cfg.rl.minibatches), int(cfg.rl.micro_batch)):
            for part in parts:
                step0[part.to(a.device)] = learner.score(data, part.to(a.device)).log_probs.float()
    for name, old in (("recorded", data["old_log_probs"].float()), ("rescored_in_order", in_order),
                      ("rescored_first_epoch", rescored)):
        gap = (step0 - old).abs()
        res[f"step0_gap_{name}"] = {"max": float(gap.max()), "mean": float(gap.mean()),
                                    "outside_clip": float((gap > math.log1p(float(cfg.rl.clip_high))).float().mean())}
    return rescored


def timed_update(learner, data: dict, cfg, a, cuda: bool, res: dict) -> None:
    opt, sched = make_optimizer(learner, cfg, a.device)
    if cuda:
        torch.cuda.synchronize()
        res["rollout_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    stats = ppo_update(learner, opt, sched, data, cfg, DistInfo(), 0, a.device)
    if cuda:
        torch.cuda.synchronize()
        res["train_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    res["train_s"] = time.perf_counter() - t
    res.update({f"train/{k}": v for k, v in stats.items()})
    res["ppo"] = {k: cfg.rl[k] for k in ("epochs", "minibatches", "micro_batch")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--folder", type=Path, default=Path("/tmp/oft7b_mw"))
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--steps", type=int, default=96)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a tiny checkpoint instead of 7B (to check the script)")
    ap.add_argument("--model", choices=("oft", "openvla"), default="oft")
    ap.add_argument("--advantage", choices=("rloo", "gae"), default="rloo")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    cuda, discrete = a.device.startswith("cuda"), a.model == "openvla"
    res: dict = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "groups": a.groups, "k": a.k,
                 "max_episode_steps": a.steps, "model": a.model, "advantage": a.advantage}
    if not (a.folder / "config.json").is_file():
        res["write_s"] = write_checkpoint(a, cuda, discrete)
    cfg = rl_config(a, discrete)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    learner, policy, loaded = load_learner(cfg, a, cuda, discrete, res)
    data = update_data(learner, roll_out(a, policy, loaded, res), cfg, a)
    res["decisions"] = len(data["advantages"])
    data["old_log_probs"] = step0_gaps(learner, data, cfg, a, res)
    timed_update(learner, data, cfg, a, cuda, res)
    res["iteration_s"] = res["rollout_s"] + res["train_s"]
    print(json.dumps(res, indent=2))
    if a.out:
        atomic_write_text(Path(a.out), json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
