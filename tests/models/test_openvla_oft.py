"""OpenVLA-OFT: small checkpoints written in the official layout, loaded, run in real simulators, RL'd."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ript.config import compose
from ript.errors import RiptError
from ript.models.openvla_oft.official import load_official
from ript.policies.oft_policy import assemble_text
from tests.helpers.official_checkpoints import write_metaworld_oft_checkpoint, write_tiny_oft_checkpoint


def build(cfg, device: str, seed: int, sample: bool):
    """(model, policy, metadata, task names) as the RL (``sample``) or evaluation stage loads them."""
    from ript.policies.families import family_for

    loaded = family_for(cfg).load(cfg, device, seed, rl=sample)
    return loaded.model, loaded.policy, loaded.metadata, loaded.task_names


# one test process runs this file's tests (pytest-xdist, --dist loadgroup), so its module fixture is built once
pytestmark = pytest.mark.xdist_group("test_openvla_oft")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_oft_checkpoint(tmp_path_factory.mktemp("oft") / "ckpt")


def reference_vit(w: dict, prefix: str, pixels: torch.Tensor, heads: int, depth: int,
                  prefix_tokens: int) -> torch.Tensor:
    """timm's ViT forward written out from the official tensors: the second-to-last block's patch tokens."""
    p = lambda k: w[prefix + k]  # noqa: E731
    x = torch.nn.functional.conv2d(pixels, p("patch_embed.proj.weight"), p("patch_embed.proj.bias"), stride=14)
    x = x.flatten(2).transpose(1, 2) + p("pos_embed")
    extra = [t for t in (w.get(prefix + "cls_token"), w.get(prefix + "reg_token")) if t is not None]
    x = torch.cat([t.expand(len(x), -1, -1) for t in extra] + [x], 1)
    d = x.shape[-1]
    ln = lambda x, k: torch.nn.functional.layer_norm(x, (d,), p(k + ".weight"), p(k + ".bias"), 1e-6)  # noqa: E731
    for i in range(depth - 1):
        b = f"blocks.{i}."
        qkv = ln(x, b + "norm1") @ p(b + "attn.qkv.weight").T + p(b + "attn.qkv.bias")
        q, k, v = qkv.reshape(len(x), -1, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-1, -2) / (d // heads) ** 0.5, -1) @ v
        a = a.transpose(1, 2).reshape(len(x), -1, d) @ p(b + "attn.proj.weight").T + p(b + "attn.proj.bias")
        x = x + a * w.get(prefix + b + "ls1.scale_factor", torch.ones(d))
        h = torch.nn.functional.gelu(ln(x, b + "norm2") @ p(b + "mlp.fc1.weight").T + p(b + "mlp.fc1.bias"))
        x = x + ((h @ p(b + "mlp.fc2.weight").T + p(b + "mlp.fc2.bias"))
                 * w.get(prefix + b + "ls2.scale_factor", torch.ones(d)))
    return x[:, prefix_tokens:]


def test_loader_maps_official_vision_weights(tiny):
    model, report = load_official(tiny)
    assert report["unused_keys"] > 0  # last blocks, final norms, SigLIP's pool head, lm_head
    weights = {}
    for f in sorted(tiny.glob("model-*.safetensors")):
        weights.update(load_file(str(f)))
    pixels = torch.rand(2, 3, 28, 28)
    for tower, prefix, mean, std, extra in (
            (model.featurizer, "vision_backbone.featurizer.", (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), 5),
            (model.fused_featurizer, "vision_backbone.fused_featurizer.", (0.5,) * 3, (0.5,) * 3, 0)):
        normed = (pixels - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
        ref = reference_vit(weights, prefix, normed, 2, 3, extra)
        torch.testing.assert_close(tower(pixels), ref, atol=1e-5, rtol=1e-4)
    lm = model.language_model.state_dict()
    torch.testing.assert_close(lm["layers.1.mlp.down_proj.weight"],
                               weights["language_model.model.layers.1.mlp.down_proj.weight"])


def test_padding_attention_modes_and_prefix_cache(tiny):
    model, _ = load_official(tiny)
    images = torch.randint(0, 255, (2, 2, 3, 28, 28), dtype=torch.uint8)
    proprio = torch.rand(2, 8) * 2 - 1
    prompts = [[1, 5, 6, 7, 3], [1, 9, 3]]
    ids, valid = assemble_text(prompts, model.action_tokens, 2, 255)
    batch = model(images, proprio, ids, valid)["mean"]
    alone_ids, alone_valid = assemble_text(prompts[1:], model.action_tokens, 2, 255)
    alone = model(images[1:], proprio[1:], alone_ids, alone_valid)["mean"]
    torch.testing.assert_close(batch[1:], alone, atol=1e-5, rtol=1e-4)  # pads change nothing
    model.cfg.attention = "prefix_causal"
    causal = model.action_hidden(images, proprio, ids, valid)
    cached = model.action_hidden(images, proprio, ids, valid, prefix_cache=True)
    torch.testing.assert_close(causal, cached, atol=1e-5, rtol=1e-4)
    model.cfg.attention = "bidirectional"
    assert not torch.allclose(model.action_hidden(images, proprio, ids, valid), causal, atol=1e-4)


def test_loader_errors_name_file_and_key(tmp_path, tiny):
    bad = write_tiny_oft_checkpoint(tmp_path / "bad")
    cfg = json.loads((bad / "config.json").read_text())
    cfg["text_config"]["intermediate_size"] = 96
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(RiptError, match=r"mlp\.(gate|up|down)_proj\.weight.*has shape"):
        load_official(bad)
    for head in bad.glob("action_head--*"):
        head.unlink()
    with pytest.raises(RiptError, match="action_head"):
        load_official(bad)
    broken = write_tiny_oft_checkpoint(tmp_path / "broken")
    shard = sorted(broken.glob("model-*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(RiptError, match=shard.name):
        load_official(broken)
    with pytest.raises(RiptError, match="unknown vision tower"):
        cfg = json.loads((tiny / "config.json").read_text())
        cfg["timm_model_ids"][0] = "vit_base_patch16_224"
        (tmp_path / "ids").mkdir()
        (tmp_path / "ids" / "config.json").write_text(json.dumps(cfg))
        load_official(tmp_path / "ids")


def test_lora_adapter_save_load_merge(tmp_path, tiny):
    from ript.models.openvla_oft.lora import add_lora, load_adapter, save_adapter

    compose_cfg = compose("oft", [f"checkpoint={tiny}"])
    model, _ = load_official(tiny)
    add_lora(model, compose_cfg.policy.lora)
    model.add_scale_head(16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name or "scale_head" in name or "action_head" in name:
                p.add_(torch.randn_like(p) * 0.05)  # not the identity LoRA starts from, nor the official head
    images = torch.randint(0, 255, (1, 2, 3, 28, 28), dtype=torch.uint8)
    ids, valid = assemble_text([[1, 5, 6, 3]], model.action_tokens, 2, 255)
    args = (images, torch.zeros(1, 8), ids, valid)
    want = model(*args)
    save_adapter(model, tmp_path / "adapter", with_action_head=True)  # RL trained the action head too
    save_adapter(model, tmp_path / "lora_only")
    # as under FSDP: from the parameters by name (gathered whole there), not from the model
    trained = {k: p.detach().clone() for k, p in model.named_parameters()
               if "lora_" in k or k.startswith(("scale_head.", "action_head."))}
    save_adapter(model, tmp_path / "from_weights", with_action_head=True, weights=trained)
    adapter, from_weights = tmp_path / "adapter", tmp_path / "from_weights"
    for folder, merge in ((adapter, False), (adapter, True), (from_weights, False)):
        fresh, _ = load_official(tiny)
        load_adapter(fresh, folder, merge=merge)
        got = fresh(*args)
        for k in ("mean", "scale"):
            torch.testing.assert_close(got[k], want[k], atol=1e-5 if merge else 0, rtol=1e-4 if merge else 0)
    configs = [json.loads((folder / "adapter_config.json").read_text()) for folder in (from_weights, adapter)]
    for config in configs:  # a set, listed in the process's hash order
        config["target_modules"] = sorted(config["target_modules"])
    assert configs[0] == configs[1]
    fresh, _ = load_official(tiny)
    load_adapter(fresh, tmp_path / "lora_only")  # the official action head: means differ, scales agree
    got = fresh(*args)
    torch.testing.assert_close(got["scale"], want["scale"], atol=0, rtol=0)
    assert not torch.allclose(got["mean"], want["mean"], atol=1e-3)


def test_libero_runner_steps_the_official_layout_checkpoint(tmp_path, tiny):
    """The policy drives a real LIBERO task through the standard runner (a few steps)."""
    from ript.stages.oft import run_eval

    cfg = compose("oft", [f"checkpoint={tiny}", "task=libero_object", "task.task_names=[" +
                          "pick_up_the_alphabet_soup_and_place_it_in_the_basket]", "task.render.image_size=32",
                          "eval.episodes_per_task=1", "eval.num_workers=1", "eval.max_episode_steps=16",
                          "eval.n_videos=0", f"out_dir={tmp_path / 'eval'}", "device=cpu"])
    results = run_eval(cfg)
    assert results["episodes"][0]["length"] == 16 and results["env_steps"] == 16
    assert (tmp_path / "eval" / "results.json").is_file()


def test_rl_iteration_rescores_the_sampled_distribution(tmp_path, monkeypatch):
    """One real RL iteration on MetaWorld (B=2, K=2, short horizon); old log-probs recomputed before any
    update equal those recorded while sampling; then a resume runs the second iteration."""
    from ript.models.openvla_oft.lora import add_lora
    from ript.rl.learners import OFTLearner
    from ript.stages import oft

    ckpt = write_metaworld_oft_checkpoint(tmp_path / "mw")
    overrides = [f"checkpoint={ckpt}", "task=metaworld_ml45", "task.task_names=[reach-v3]", "task.render.image_size=32",
                 "task.render.cameras=[corner]", "policy.image_keys=[corner_rgb]", "policy.proprio_keys=[robot_states]",
                 "policy.gripper=none", "policy.center_crop=false", "rl.groups_per_iteration=2",
                 "rl.rollouts_per_group=2",
                 "rl.max_sampling_rounds=1", "rl.max_episode_steps=16", "rl.num_workers=1", "rl.minibatches=2",
                 "policy.init_scale=0.5", "device=cpu", f"run_dir={tmp_path / 'run'}", "rl.iterations=1",
                 "logger=tensorboard"]
    cfg = compose("oft", overrides)
    model, policy, metadata, names = build(cfg, "cpu", 0, sample=True)
    add_lora(model, cfg.policy.lora)
    model.add_scale_head(16, 0.5)
    learner = OFTLearner(model, grad_checkpointing=False, train_action_head=False)
    learner.attach(policy)
    from ript.envs.runner import EnvRunner, RunnerOptions
    from ript.envs.worker_env import EpisodeSpec

    runner = EnvRunner(RunnerOptions("metaworld", names, metadata["env_args"]["render"], 16, episodes_per_task=1,
                                     num_workers=1))
    try:
        eps = runner.run(policy, specs=[EpisodeSpec("reach-v3", 3 * 10**9 + j, j) for j in range(2)])["episodes"]
    finally:
        runner.close()
    decisions = [d for e in eps for d in e["decisions"]]
    assert len(decisions) == 4  # 16 steps / 8-step chunks x 2 episodes
    data = learner.collate(decisions, "cpu")
    with torch.no_grad():
        again = learner.score(data, torch.arange(len(decisions))).log_probs
    torch.testing.assert_close(again, data["old_log_probs"], atol=1e-4, rtol=1e-4)
    with torch.no_grad():  # the Laplace means evaluation executes, one row of the recorded actions' size each
        means = learner.evaluation_actions(data, torch.arange(len(decisions)))
    assert means.shape == data["actions"].flatten(1).shape and torch.isfinite(means).all()
    assert not torch.equal(means, data["actions"].flatten(1).float())  # the rollout sampled around them

    # the rank's device is chosen before the (7B) model is built on it: record the order of the real calls
    from ript.policies.vla_family import VLAFamily
    from ript.rl import loop
    from ript.stages import rl

    order = []
    real_init, real_load = loop.init_rank, VLAFamily.load
    monkeypatch.setattr(rl, "init_rank", lambda c: order.append("init_rank") or real_init(c))
    monkeypatch.setattr(VLAFamily, "load", lambda *a, **k: order.append("load") or real_load(*a, **k))
    out = Path(oft.run_rl(cfg))  # the oft-rl shorthand: ript rl with the oft job's config
    assert order == ["init_rank", "load"]
    assert (out / "checkpoints" / "last" / "adapter" / "adapter_config.json").is_file()
    resumed = oft.run_rl(compose("oft", [*overrides[:-2], "rl.iterations=2", "resume=true", "logger=tensorboard"]))
    steps = sorted(p.name for p in (Path(resumed) / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == ["0000001", "0000002"]
    for step in steps:  # every RL checkpoint carries its adapter, so any of them can be evaluated
        assert (Path(resumed) / "checkpoints" / step / "adapter" / "adapter_model.safetensors").is_file()

    # the model loader rebuilds an RL checkpoint (its official base folder + adapter/, merged) into the model RL
    # trained. One short MetaWorld iteration solves nothing (no update), so move the trained parameters first and
    # write them the way RL does (the learner's checkpoint files), into a copy of the last checkpoint.
    import shutil

    from ript.model_loader import check_and_load, load_model

    last = Path(resumed) / "checkpoints" / "last"
    ref_model, ref_policy, _, _ = build(cfg, "cpu", 0, sample=False)
    inputs = {"images": data["images"], "prompts": data["prompts"], "proprio": data["proprio"]}
    with torch.no_grad():
        base_mean = ref_policy.forward(inputs)["mean"]
    add_lora(ref_model, cfg.policy.lora)
    ref_model.add_scale_head(int(cfg.policy.scale_head_hidden), float(cfg.policy.init_scale))
    ref_learner = OFTLearner(ref_model, False, False)
    check_and_load(ref_learner.weights, load_file(str(last / "model.safetensors")), str(last))
    with torch.no_grad():
        for p in ref_learner.params:
            p.add_(torch.randn_like(p) * 0.05)
    moved = tmp_path / "moved"
    shutil.copytree(last, moved, ignore=shutil.ignore_patterns("adapter"))
    ref_learner.write_extra(moved)
    _, ck = load_model(moved, device="cpu")
    assert ck["model_kwargs"]["base_checkpoint"] == str(ckpt.resolve()) and ck["weights_format"] == "adapter"
    _, by_adapter, _, _ = build(compose("oft", [*overrides[1:], f"adapter={moved}"]), "cpu", 0, sample=False)
    with torch.no_grad():
        got, want = by_adapter.forward(inputs), ref_policy.forward(inputs)
    for k in ("mean", "scale"):
        torch.testing.assert_close(got[k], want[k], atol=1e-5, rtol=1e-4)
    assert not torch.allclose(got["mean"], base_mean, atol=1e-3)  # the adapter was applied
    with pytest.raises(RiptError, match="was trained on"):
        build(compose("oft", [*overrides[1:], f"adapter={moved}", f"checkpoint={tmp_path}"]), "cpu", 0, False)


def test_oft_critic_values_and_bootstraps_are_recorded_as_recomputed(tmp_path):
    """PPO-GAE on OFT: the attention-pooling value head over the action positions' hidden states records each
    decision's value and, for episodes cut by the time limit (12 steps = 8 + 4 of a chunk), the value of the
    last observation; the training forward gives the same values; one PPO-GAE update trains the critic in
    its own parameter group (its learning rate apart from LoRA's)."""
    from ript.envs.runner import EnvRunner, RunnerOptions
    from ript.envs.worker_env import EpisodeSpec
    from ript.models.openvla_oft.lora import add_lora
    from ript.rl.advantages import GAE
    from ript.rl.learners import OFTLearner
    from ript.rl.update import make_optimizer, ppo_update, update_batch
    from ript.utils.distributed import DistInfo

    ckpt = write_metaworld_oft_checkpoint(tmp_path / "mw")
    cfg = compose("oft", [f"checkpoint={ckpt}", "task=metaworld_ml45", "task.task_names=[reach-v3]",
                          "task.render.image_size=32", "task.render.cameras=[corner]", "policy.image_keys=[corner_rgb]",
                          "policy.proprio_keys=[robot_states]", "policy.gripper=none", "policy.center_crop=false",
                          "rl.advantage=gae", "rl.rollouts_per_group=1", "rl.reward=dense", "rl.epochs=1",
                          "rl.minibatches=1", "rl.critic.lr=1e-3", "rl.critic.hidden=16", "device=cpu"])
    model, policy, metadata, names = build(cfg, "cpu", 0, sample=True)
    add_lora(model, cfg.policy.lora)
    model.add_scale_head(16, 0.5)
    learner = OFTLearner(model, grad_checkpointing=False, train_action_head=False, critic_cfg=cfg.rl.critic)
    torch.nn.init.normal_(learner.critic.mlp[-1].weight, std=0.5)  # a fresh head predicts 0 everywhere
    learner.attach(policy)
    runner = EnvRunner(RunnerOptions("metaworld", names, metadata["env_args"]["render"], 12, episodes_per_task=1,
                                     num_workers=1))
    try:
        eps = runner.run(policy, specs=[EpisodeSpec("reach-v3", 3 * 10**9 + j, j) for j in range(2)])["episodes"]
    finally:
        runner.close()
    assert all(not e["success"] and len(e["decisions"]) == 2 for e in eps)
    assert all("bootstrap_value" in e["decisions"][-1] for e in eps)
    data, _ = update_batch(learner, [[e] for e in eps], GAE(cfg.rl), cfg, "cpu", DistInfo())
    with torch.no_grad():
        scored = learner.score(data, torch.arange(len(data["old_values"])))
    torch.testing.assert_close(scored.values, data["old_values"], atol=1e-4, rtol=1e-4)
    assert data["old_values"].abs().min() > 0  # the head is live, not a constant 0
    opt, sched = make_optimizer(learner, cfg, "cpu")
    assert [g["lr"] for g in opt.param_groups] == [pytest.approx(float(cfg.rl.lr)), pytest.approx(1e-3)]
    before = [p.detach().clone() for p in learner.critic.parameters()]
    stats = ppo_update(learner, opt, sched, data, cfg, DistInfo(), 0, "cpu")
    assert stats["value_loss"] > 0 and stats["critic_grad_norm"] > 0
    assert any(not torch.equal(a, p) for a, p in zip(before, learner.critic.parameters()))
