"""The original (discrete-token) OpenVLA: a small checkpoint in the official openvla-7b layout, loaded, run in
MetaWorld with a Categorical policy over action bins, rescored and updated by PPO-GAE."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ript.config import compose, to_dict
from ript.envs.runner import EnvRunner, RunnerOptions
from ript.envs.suites import get_suite
from ript.envs.worker_env import EpisodeSpec
from ript.errors import RiptError
from ript.models.openvla.official import load_official_openvla
from ript.models.openvla_oft.official import dataset_statistics, pick_statistics
from tests.helpers.official_checkpoints import (
    TINY_TEXT,
    TINY_VISION,
    official_config,
    write_official_checkpoint,
)

BINS = 16


def write_tiny_openvla(folder: Path) -> Path:
    cfg = official_config(TINY_TEXT, image_size=28, vision_overrides=TINY_VISION)
    cfg["n_action_bins"] = BINS  # the tiny tokenizer has a few dozen ids; OpenVLA's 256 bins need Llama's 32,000
    return write_official_checkpoint(folder, cfg, "metaworld", seed=0, action_dim=4, proprio_dim=None,
                                     oft_components=False)


# one test process runs this file's tests (pytest-xdist, --dist loadgroup), so its module fixture is built once
pytestmark = pytest.mark.xdist_group("test_openvla")


@pytest.fixture(scope="module")
def tiny_openvla(tmp_path_factory) -> Path:
    return write_tiny_openvla(tmp_path_factory.mktemp("openvla") / "ckpt")


def test_loader_reads_the_official_layout_with_its_lm_head(tiny_openvla, tmp_path):
    model, report = load_official_openvla(tiny_openvla)
    weights = load_file(str(tiny_openvla / "model.safetensors"))
    assert torch.equal(model.lm_head.weight, weights["language_model.lm_head.weight"])
    assert torch.equal(model.language_model.norm.weight, weights["language_model.model.norm.weight"])
    assert model.n_bins == BINS and model.proprio_projector is None and report["unused_keys"] > 0
    assert not (tiny_openvla / "dataset_statistics.json").exists() and "metaworld" in report["statistics"]

    broken = tmp_path / "broken"
    broken.mkdir()
    for f in tiny_openvla.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    del weights["language_model.lm_head.weight"]
    save_file(weights, str(broken / "model.safetensors"))
    with pytest.raises(RiptError, match="lacks 1 weights of the model, e.g. 'lm_head.weight'"):
        load_official_openvla(broken)


def build(folder: Path, sample: bool):
    from transformers import PreTrainedTokenizerFast

    from ript.policies.openvla_policy import OpenVLAPolicy

    model, _ = load_official_openvla(folder)
    stats = pick_statistics(dataset_statistics(folder), "metaworld", None, str(folder))
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder))
    policy = OpenVLAPolicy(model, tokenizer, stats, get_suite("metaworld").instructions(["reach-v3"]), ["corner_rgb"],
                           "cpu", center_crop=False, gripper="none", sample=sample, seed=0, amp=False,
                           temperature=1.5)
    return model, policy


def test_sampled_bins_are_scored_as_recorded_and_ppo_gae_updates_lora_and_critic(tiny_openvla):
    """Bins sampled token by token with a KV cache, their log-probs and the critic's values, equal those of one
    teacher-forced forward (what PPO trains on); episodes cut by the time limit carry the value of their last
    observation; greedy decoding takes the most likely bin; one PPO-GAE update moves LoRA and the critic."""
    from ript.models.openvla_oft.lora import add_lora
    from ript.rl.advantages import GAE
    from ript.rl.learners import OpenVLALearner
    from ript.rl.rollout import flatten_groups
    from ript.rl.update import make_optimizer, ppo_update
    from ript.utils.distributed import DistInfo

    cfg = compose("oft", [f"checkpoint={tiny_openvla}", "task=metaworld_ml45", "task.task_names=[reach-v3]",
                          "task.render.image_size=32", "task.render.cameras=[corner]", "rl.advantage=gae",
                          "rl.rollouts_per_group=1", "rl.epochs=1", "rl.minibatches=2", "rl.lr=1e-3",
                          "rl.critic.hidden=16", "rl.critic.lr=1e-3", "device=cpu"])
    model, policy = build(tiny_openvla, sample=True)
    add_lora(model, cfg.policy.lora)
    learner = OpenVLALearner(model, grad_checkpointing=False, critic_cfg=cfg.rl.critic)
    torch.nn.init.normal_(learner.critic.mlp[-1].weight, std=0.5)  # a fresh head predicts 0 everywhere
    learner.attach(policy)
    runner = EnvRunner(RunnerOptions("metaworld", ["reach-v3"], to_dict(cfg.task.render), 5, episodes_per_task=1,
                                     num_workers=1))
    try:
        eps = runner.run(policy, specs=[EpisodeSpec("reach-v3", 3 * 10**9 + j, j) for j in range(2)])["episodes"]
    finally:
        runner.close()
    assert all(len(e["decisions"]) == 5 and "bootstrap_value" in e["decisions"][-1] for e in eps)
    decisions, targets = flatten_groups([[e] for e in eps], GAE(cfg.rl), "sparse", 1.0)
    data = learner.collate(decisions, "cpu")
    assert data["actions"].dtype == torch.long and data["actions"].shape == (10, 4)
    assert len(set(map(tuple, data["actions"].tolist()))) > 1  # sampled, not one fixed action
    data.update(advantages=torch.linspace(-1, 1, 10), returns=targets.returns,
                old_values=torch.stack([d["value"] for d in decisions]))
    with torch.no_grad():
        scored = learner.score(data, torch.arange(10))
    torch.testing.assert_close(scored.log_probs, data["old_log_probs"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(scored.values, data["old_values"], atol=1e-4, rtol=1e-4)
    assert ((scored.entropy > 0) & (scored.entropy <= torch.log(torch.tensor(float(BINS))) + 1e-5)).all()

    greedy = policy._decode({"images": data["images"][:2], "prompts": data["prompts"][:2]}, None)[0]
    with torch.no_grad():
        logits, _ = policy.score_forward({"images": data["images"][:2], "prompts": data["prompts"][:2]}, greedy)
    assert torch.equal(greedy, logits.argmax(-1))

    opt, sched = make_optimizer(learner, cfg, "cpu")
    lora = [p.detach().clone() for p in learner.params]
    critic = [p.detach().clone() for p in learner.critic.parameters()]
    stats = ppo_update(learner, opt, sched, data, cfg, DistInfo(), 0, "cpu")
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=0.05) and stats["value_loss"] > 0
    assert any(not torch.equal(a, p) for a, p in zip(lora, learner.params))
    assert any(not torch.equal(a, p) for a, p in zip(critic, learner.critic.parameters()))


def test_rl_and_eval_run_an_openvla_folder_and_evaluate_its_rl_checkpoint(tiny_openvla, tmp_path):
    """`ript rl policy=openvla` on an openvla-7b-layout folder: PPO-GAE with the critic, one iteration; the RL
    checkpoint (a LoRA adapter beside a pointer to the folder) evaluates through `ript eval policy=openvla`."""
    from ript.policies.families import family_for
    from ript.stages import evaluate, rl

    task = ["task=metaworld_ml45", "task.task_names=[reach-v3]", "task.render.image_size=32",
            "task.render.cameras=[corner]", "policy=openvla", "policy.image_keys=[corner_rgb]", "policy.gripper=none",
            "device=cpu"]
    run = rl.run(compose("rl", [f"checkpoint={tiny_openvla}", *task,
        "rl.advantage=gae", "rl.reward=dense", "rl.reward_scale=0.1", "rl.groups_per_iteration=2",
        "rl.rollouts_per_group=1", "rl.max_episode_steps=4", "rl.num_workers=1", "rl.minibatches=1", "rl.epochs=1",
        "rl.micro_batch=8", "rl.recompute_old_log_probs=true", "rl.critic.hidden=16", "rl.iterations=1", "eval.every=0",
        f"run_dir={tmp_path / 'run'}",
        "policy.gradient_checkpointing=false"]))
    last = Path(run) / "checkpoints" / "last"
    assert (last / "adapter" / "adapter_model.safetensors").is_file() and (last / "critic.safetensors").is_file()
    config = json.loads((last / "config.json").read_text())
    assert config["model_name"] == "openvla" and config["weights_format"] == "adapter"
    results = evaluate.run(compose("eval", [f"checkpoint={run}", *task, "episodes_per_task=1", "num_workers=1",
                                            "max_episode_steps=3", "n_videos=0", f"out_dir={tmp_path / 'eval'}"]))
    assert results["episodes"][0]["length"] == 3 and results["adapter"] == run

    with pytest.raises(RiptError, match="takes 1 images; policy.image_keys names 2"):
        cfg = compose("eval", [f"checkpoint={tiny_openvla}", *task, "policy.image_keys=[corner_rgb,gripperPOV_rgb]"])
        family_for(cfg).load(cfg, "cpu", 0, rl=False)
    with pytest.raises(RiptError, match="holds the openvla policy family.s model; run it with policy=openvla"):
        family_for(compose("eval", [f"checkpoint={tiny_openvla}", "task=metaworld_ml45"]))  # policy=skill_prior
