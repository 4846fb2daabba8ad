"""π0 from a tiny folder in openpi's PyTorch layout: every weight loads under its official name, bad folders are
one line, the expert's cached prefix equals one joint attention over prefix and suffix, and the policy evaluates,
records and trains one RL iteration with each noise method on MetaWorld."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from ript.config import compose
from ript.errors import RiptError
from ript.model_loader import load_model
from ript.models.pi0.model import time_embedding
from ript.registry import MODELS
from ript.stages import evaluate, rl
from tests.helpers.cli import pi0_rl_overrides
from tests.helpers.official_checkpoints import write_lerobot_pi0_checkpoint, write_metaworld_pi0_checkpoint

# one test process runs this file's tests (pytest-xdist, --dist loadgroup), so its module fixture is built once
pytestmark = pytest.mark.xdist_group("test_pi0")


@pytest.fixture(scope="module")
def pi0_folder(tmp_path_factory):
    return write_metaworld_pi0_checkpoint(tmp_path_factory.mktemp("pi0") / "pi0_tiny")


def build(folder):
    import ript.models  # noqa: F401  (registers pi0)

    return MODELS.build("pi0", base_checkpoint=str(folder), dtype="bf16")


def test_every_official_weight_loads_and_bad_folders_are_one_line(pi0_folder, tmp_path):
    model = build(pi0_folder)
    official = load_file(str(pi0_folder / "model.safetensors"))
    assert torch.equal(model.embed_tokens.weight, official["paligemma_with_expert.paligemma.lm_head.weight"])
    assert torch.equal(model.expert_layers[1].mlp.down_proj.weight,
                       official["paligemma_with_expert.gemma_expert.model.layers.1.mlp.down_proj.weight"])
    vision = [k for k in model.state_dict() if k.endswith("patch_embedding.weight")][0]
    assert torch.equal(model.state_dict()[vision], official["paligemma_with_expert.paligemma.model.vision_tower."
                                                           "vision_model.embeddings.patch_embedding.weight"])

    def broken(change) -> str:
        folder = tmp_path / f"case{len(list(tmp_path.iterdir()))}"
        shutil.copytree(pi0_folder, folder)
        change(folder)
        with pytest.raises(RiptError) as e:
            build(folder)
        return str(e.value)

    def drop_key(folder):
        state = load_file(str(folder / "model.safetensors"))
        del state["state_proj.bias"]
        save_file(state, str(folder / "model.safetensors"))

    def edit(name, fn):
        def change(folder):
            path = next(folder.glob(f"**/{name}"))
            path.write_text(json.dumps(fn(json.loads(path.read_text()))))
        return change

    assert "norm_stats.json: missing" in _norm_error(pi0_folder, tmp_path, lambda f: shutil.rmtree(f / "assets"))
    assert "not openpi's norm_stats layout" in _norm_error(
        pi0_folder, tmp_path, edit("norm_stats.json", lambda j: {"norm_stats": {"state": {"mean": [0.0]}}}))
    assert "config.json: no 'action_horizon'" in broken(edit("config.json", lambda j: {
        k: v for k, v in j.items() if k != "action_horizon"}))
    assert "no weight for 'state_proj.bias'" in broken(drop_key)
    assert "no model.safetensors" in broken(lambda f: (f / "model.safetensors").unlink())


def _norm_error(pi0_folder, tmp_path, change) -> str:
    from ript.models.pi0.official import norm_stats

    folder = tmp_path / f"norm{len(list(tmp_path.iterdir()))}"
    shutil.copytree(pi0_folder, folder)
    change(folder)
    with pytest.raises(RiptError) as e:
        norm_stats(folder, None)
    return str(e.value)


def test_lerobots_pi0_folder_gives_the_same_model_and_statistics_and_bad_ones_are_one_line(pi0_folder, tmp_path):
    from ript.models.pi0.official import norm_stats

    lerobot = write_lerobot_pi0_checkpoint(pi0_folder, tmp_path / "lerobot")
    ours, theirs = build(pi0_folder).state_dict(), build(lerobot).state_dict()
    assert list(ours) == list(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
    a, b = norm_stats(pi0_folder, None), norm_stats(lerobot, None)
    assert all(torch.equal(a[part][stat], b[part][stat]) for part in a for stat in ("mean", "std"))
    untied = write_lerobot_pi0_checkpoint(pi0_folder, tmp_path / "untied", untied_embedding=True)
    embedding = load_file(str(untied / "model.safetensors"))[
        "model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"]
    assert torch.equal(build(untied).embed_tokens.weight, embedding)  # the embedding, not the lm_head beside it
    results = evaluate.run(compose("eval", pi0_eval_overrides(lerobot, tmp_path / "eval")))
    assert results["episodes"]  # its own tokenizer folder, statistics and weights, through ript eval

    def broken(change, read=build) -> str:
        folder = tmp_path / f"case{len(list(tmp_path.iterdir()))}"
        shutil.copytree(lerobot, folder)
        change(folder)
        with pytest.raises(RiptError) as e:
            read(folder)
        assert "\n" not in str(e.value)
        return str(e.value)

    def config(**changes):
        def change(folder):
            path = folder / "config.json"
            path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
        return change

    def pipeline(norm_map):
        def change(folder):
            path = folder / "policy_preprocessor.json"
            steps = json.loads(path.read_text())
            steps["steps"][1]["config"]["norm_map"] = norm_map
            path.write_text(json.dumps(steps))
        return change

    def unprefixed(folder):
        state = load_file(str(folder / "model.safetensors"))
        save_file({k.removeprefix("model."): v for k, v in state.items()}, str(folder / "model.safetensors"))

    stats = lambda folder: norm_stats(folder, None)  # noqa: E731
    assert "type='pi05'; only lerobot's \"pi0\" policy is read" in broken(config(type="pi05"))
    assert "norm_map.STATE='QUANTILES'; π0 reads MEAN_STD" in broken(pipeline({"STATE": "QUANTILES"}), stats)
    assert "policy_preprocessor.json: no normalizer step" in broken(
        lambda f: (f / "policy_preprocessor.json").unlink(), stats)
    assert "is not under 'model.'; not lerobot's pi0 state dict" in broken(unprefixed)


@torch.no_grad()
def test_the_cached_prefix_equals_one_joint_attention_over_prefix_and_suffix(pi0_folder):
    """π0's layers attend jointly over [prefix; suffix] with a block mask; the prefix never sees the suffix, so the
    expert reading the prefix's cached keys and values must give the joint computation's result."""
    model = build(pi0_folder).float()
    g = torch.Generator().manual_seed(0)
    images = torch.rand(2, 1, 3, 28, 28, generator=g) * 2 - 1
    tokens = torch.randint(1, 20, (2, 6), generator=g)
    token_masks = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    state, x, tau = torch.randn(2, 32, generator=g), torch.randn(2, 5, 32, generator=g), torch.tensor([1.0, 0.3])
    prefix = model.encode(images, torch.ones(2, 1, dtype=torch.bool), tokens, token_masks, state)
    velocity, _ = model.expert(x, tau, prefix.cache)

    # the reference: both streams through every layer at once, one attention over all tokens
    hp = torch.cat([model.projector(model.vision(pixel_values=images.flatten(0, 1)).last_hidden_state),
                    model.embed_tokens(tokens) * model.prefix_width ** 0.5], 1)
    t = time_embedding(tau, model.expert_width)[:, None].expand(-1, 5, -1)
    hs = torch.cat([model.state_proj(state)[:, None], model.action_time_mlp_out(F.silu(model.action_time_mlp_in(
        torch.cat([model.action_in_proj(x), t], -1))))], 1)
    pad = torch.cat([torch.ones(2, hp.shape[1] - 6, dtype=torch.bool), token_masks, torch.ones(2, 6, dtype=torch.bool)],
                    1)
    block = torch.tensor([0] * hp.shape[1] + [1] + [2] * 5)  # prefix 0, state 1, actions 2
    mask = (block[None, :] <= block[:, None])[None] & pad[:, None, :] & pad[:, :, None]
    positions = pad.long().cumsum(1) - 1
    for pl, el in zip(model.prefix_layers, model.expert_layers, strict=True):
        hp, hs = _joint_layer(model, pl, el, hp, hs, positions, mask)
    reference = model.action_out_proj(model.expert_norm(hs)[:, 1:])
    assert torch.allclose(velocity, reference, atol=1e-5), (velocity - reference).abs().max()


def _joint_layer(model, pl, el, hp, hs, positions, mask):
    from transformers.models.gemma.modeling_gemma import apply_rotary_pos_emb

    n = hp.shape[1]
    qkv = []
    for layer, h in ((pl, hp), (el, hs)):
        a, x = layer.self_attn, layer.input_layernorm(h)
        qkv.append([p(x).view(len(h), h.shape[1], -1, a.head_dim).transpose(1, 2) for p in (a.q_proj, a.k_proj,
                                                                                           a.v_proj)])
    q, k, v = (torch.cat([qkv[0][i], qkv[1][i]], 2) for i in range(3))
    cos, sin = model.rotary(q, positions)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], enable_gqa=True).transpose(1, 2)
    out = out.reshape(out.shape[0], out.shape[1], -1)
    new = []
    for layer, h, o in ((pl, hp, out[:, :n]), (el, hs, out[:, n:])):
        h = h + layer.self_attn.o_proj(o)
        new.append(h + layer.mlp(layer.post_attention_layernorm(h)))
    return new


def pi0_eval_overrides(checkpoint, out_dir) -> list[str]:
    """``ript eval`` of a π0 folder or RL run: one short MetaWorld episode."""
    return [f"checkpoint={checkpoint}", "policy=pi0", "task=metaworld_quick", "task.render.image_size=32",
            "policy.image_keys=[corner_rgb]", "policy.state_keys=[robot_states]", "policy.delta_dims=0",
            "policy.action_horizon=4", "policy.denoise_steps=2", "task_names=[drawer-close-v3]", "episodes_per_task=1",
            "num_workers=1", "max_episode_steps=8", f"out_dir={out_dir}", "n_videos=0"]


@pytest.mark.parametrize("method, extra", [("flow_noise", ()), ("flow_sde", ("rl.flow_matching_coef=1.0",))],
                         ids=["flow_noise", "flow_sde-flow_matching"])
def test_pi0_trains_its_action_expert_one_rl_iteration_and_the_run_evaluates(pi0_folder, tmp_path, method, extra):
    run = tmp_path / "rl"
    rl.run(compose("rl", pi0_rl_overrides(pi0_folder, run, 1, f"policy.noise_method={method}", *extra)))
    saved = load_file(str(run / "checkpoints" / "last" / "model.safetensors"))
    assert saved and all(k.startswith(("expert_", "state_proj", "action_", "noise_head")) for k in saved)
    trained, _ = load_model(run, expect_stage="rl")
    base = build(pi0_folder).float()
    assert not torch.equal(trained.action_out_proj.weight, base.action_out_proj.weight)  # the expert learnt
    assert torch.equal(trained.prefix_layers[0].mlp.up_proj.weight, base.prefix_layers[0].mlp.up_proj.weight)
    results = evaluate.run(compose("eval", pi0_eval_overrides(run, tmp_path / "eval")))
    assert results["sampling"] == {"action_horizon": 4, "denoise_steps": 2, "ode": True} and results["episodes"]
