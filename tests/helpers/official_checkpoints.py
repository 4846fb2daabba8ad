"""Write an OpenVLA-OFT checkpoint folder in the official layout with random weights: small ones for tests,
full 7B ones for the speed benchmarks on a GPU (benchmarks/oft_gpu.py, benchmarks/oft_gpu_rl.py). Key names and
shapes are listed from the config alone (not from ``OpenVLAOFT``), so the loader is checked against an independent
description of the layout.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ript.models.openvla_oft.config import OFTConfig
from ript.utils.atomic import atomic_write_text

LLAMA2_7B = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 32, "vocab_size": 32064, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6}


def official_config(text_config: dict | None = None, image_size: int = 224,
                    vision_overrides: dict | None = None) -> dict:
    """config.json as OpenVLA(-OFT) ships it (the Llama sizes fall back to LlamaConfig's 7B defaults)."""
    cfg = {
        "architectures": ["OpenVLAForActionPrediction"], "model_type": "openvla",
        "arch_specifier": "no-align+fused-gelu-mlp", "vision_backbone_id": "dinosiglip-vit-so-224px",
        "llm_backbone_id": "llama2-7b-pure", "hf_llm_id": "meta-llama/Llama-2-7b-hf", "llm_max_length": 2048,
        "use_fused_vision_backbone": True, "image_resize_strategy": "resize-naive", "image_sizes": [image_size] * 2,
        "timm_model_ids": ["vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224"],
        "timm_override_act_layers": [None, None], "n_action_bins": 256, "pad_to_multiple_of": 64,
        "pad_token_id": 32000, "output_projector_states": False, "torch_dtype": "bfloat16",
        "text_config": {"model_type": "llama", "pad_token_id": 32000, "torch_dtype": "bfloat16", "vocab_size": 32064,
                        **(text_config or {})},
    }
    text = cfg["text_config"]
    if text["pad_token_id"] >= text["vocab_size"]:  # small test vocabularies: the last id pads
        text["pad_token_id"] = cfg["pad_token_id"] = text["vocab_size"] - 1
    if vision_overrides:
        cfg["ript_vision_overrides"] = vision_overrides
    return cfg


def official_shapes(cfg: OFTConfig, proprio: bool = True) -> tuple[dict, dict, dict]:
    """(safetensors keys, action-head keys, proprio-projector keys) -> shapes, as OFT saves them."""
    main: dict[str, tuple] = {}
    n = cfg.patches_per_image
    for prefix, t in zip(("vision_backbone.featurizer.", "vision_backbone.fused_featurizer."), cfg.towers):
        d, m = t.embed_dim, t.mlp_dim
        if t.class_token:
            main[prefix + "cls_token"] = (1, 1, d)
        if t.register_tokens:
            main[prefix + "reg_token"] = (1, t.register_tokens, d)
        main[prefix + "pos_embed"] = (1, n, d)
        main[prefix + "patch_embed.proj.weight"] = (d, 3, t.patch_size, t.patch_size)
        main[prefix + "patch_embed.proj.bias"] = (d,)
        for i in range(t.depth):
            b = f"{prefix}blocks.{i}."
            main.update({b + "norm1.weight": (d,), b + "norm1.bias": (d,), b + "attn.qkv.weight": (3 * d, d),
                         b + "attn.qkv.bias": (3 * d,), b + "attn.proj.weight": (d, d), b + "attn.proj.bias": (d,),
                         b + "norm2.weight": (d,), b + "norm2.bias": (d,), b + "mlp.fc1.weight": (m, d),
                         b + "mlp.fc1.bias": (m,), b + "mlp.fc2.weight": (d, m), b + "mlp.fc2.bias": (d,)})
            if t.layer_scale:
                main[b + "ls1.scale_factor"] = (d,)
                main[b + "ls2.scale_factor"] = (d,)
        main[prefix + "norm.weight"] = (d,)
        main[prefix + "norm.bias"] = (d,)
        if not t.class_token:  # SigLIP keeps timm's attention-pool head
            p = prefix + "attn_pool."
            main.update({p + "latent": (1, 1, d), p + "q.weight": (d, d), p + "q.bias": (d,),
                         p + "kv.weight": (2 * d, d), p + "kv.bias": (2 * d,), p + "proj.weight": (d, d),
                         p + "proj.bias": (d,), p + "norm.weight": (d,),
                         p + "norm.bias": (d,), p + "mlp.fc1.weight": (m, d), p + "mlp.fc1.bias": (m,),
                         p + "mlp.fc2.weight": (d, m), p + "mlp.fc2.bias": (d,)})
    v, lm = cfg.vision_dim, cfg.llama_config()
    L, inter, vocab = lm.hidden_size, lm.intermediate_size, lm.vocab_size
    kv = lm.num_key_value_heads * (L // lm.num_attention_heads)
    main.update({"projector.fc1.weight": (4 * v, v), "projector.fc1.bias": (4 * v,), "projector.fc2.weight": (L, 4 * v),
                 "projector.fc2.bias": (L,), "projector.fc3.weight": (L, L), "projector.fc3.bias": (L,)})
    main["language_model.model.embed_tokens.weight"] = (vocab, L)
    for i in range(lm.num_hidden_layers):
        b = f"language_model.model.layers.{i}."
        main.update({b + "self_attn.q_proj.weight": (L, L), b + "self_attn.k_proj.weight": (kv, L),
                     b + "self_attn.v_proj.weight": (kv, L), b + "self_attn.o_proj.weight": (L, L),
                     b + "mlp.gate_proj.weight": (inter, L), b + "mlp.up_proj.weight": (inter, L),
                     b + "mlp.down_proj.weight": (L, inter), b + "input_layernorm.weight": (L,),
                     b + "post_attention_layernorm.weight": (L,)})
    main["language_model.model.norm.weight"] = (L,)
    main["language_model.lm_head.weight"] = (vocab, L)
    a, h = cfg.action_dim, cfg.head_hidden_dim or L
    head = {"model.layer_norm1.weight": (L * a,), "model.layer_norm1.bias": (L * a,), "model.fc1.weight": (h, L * a),
            "model.fc1.bias": (h,), "model.layer_norm2.weight": (h,), "model.layer_norm2.bias": (h,),
            "model.fc2.weight": (a, h), "model.fc2.bias": (a,)}
    for j in range(cfg.head_blocks):
        b = f"model.mlp_resnet_blocks.{j}.ffn."
        head.update({b + "0.weight": (h,), b + "0.bias": (h,), b + "1.weight": (h, h), b + "1.bias": (h,)})
    proprio_keys = ({"fc1.weight": (L, cfg.proprio_dim), "fc1.bias": (L,), "fc2.weight": (L, L), "fc2.bias": (L,)}
                    if proprio else {})
    return main, head, proprio_keys


def _random(key: str, shape: tuple, gen: torch.Generator, device, dtype) -> torch.Tensor:
    t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * 0.02
    if key.endswith(("norm.weight", "norm1.weight", "norm2.weight", "layernorm.weight", "ffn.0.weight")):
        t += 1.0  # norms start near identity, as trained ones are
    if "scale_factor" in key:
        t = t.abs() * 5  # LayerScale ~0.1
    return t.to(dtype)


def libero_statistics(action_dim: int = 7, proprio_dim: int = 8) -> dict:
    """Plausible bounds for LIBERO-style delta actions (gripper dim not normalised) and proprio."""
    def stats(dim: int, lo: float, hi: float, gripper_mask: bool) -> dict:
        mask = [True] * dim
        if gripper_mask:
            mask[-1] = False
        return {"mean": [0.0] * dim, "std": [0.3] * dim, "min": [lo] * dim, "max": [hi] * dim,
                "q01": [lo * 0.9] * dim, "q99": [hi * 0.9] * dim, "mask": mask}

    return {"action": stats(action_dim, -0.9, 0.9, True), "proprio": stats(proprio_dim, -1.0, 1.0, False),
            "num_transitions": 0, "num_trajectories": 0}


def write_tokenizer(folder: Path, words: list[str]) -> None:
    """A word-level stand-in for the Llama-2 tokenizer (``<s>``=1, ``</s>``=2, ``▁``), in tokenizer.json form."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "▁": 3}
    for w in words:
        vocab.setdefault("▁" + w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<unk>")
    fast.save_pretrained(str(folder))


PROMPT_WORDS = ["in:", "what", "action", "should", "the", "robot", "take", "to", "out:",
                "pick", "up", "place", "put", "open", "close", "turn", "on", "push"]


def write_official_checkpoint(folder: str | Path, config: dict, unnorm_key: str, seed: int = 0,
                              device: str = "cpu", dtype: torch.dtype = torch.float32, step: int = 150000,
                              shard_bytes: int = 5 * 2**30, words: list[str] | None = None,
                              chunk_size: int = 8, action_dim: int = 7, proprio_dim: int | None = 8,
                              oft_components: bool = True) -> Path:
    """Random weights in the official folder layout; returns the folder. ``oft_components=False`` writes the
    original OpenVLA's layout (``openvla/openvla-7b``): no OFT head files, statistics only in config.json."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = OFTConfig.from_dict(config, chunk_size=chunk_size, action_dim=action_dim, proprio_dim=proprio_dim or 8)
    main, head, proprio = official_shapes(cfg, proprio=proprio_dim is not None)
    gen = torch.Generator(device=device).manual_seed(seed)
    bytes_per = torch.finfo(dtype).bits // 8
    shards: list[dict[str, tuple]] = [{}]
    size = 0
    for key, shape in main.items():
        n = int(torch.Size(shape).numel()) * bytes_per
        if shards[-1] and size + n > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = shape
        size += n
    weight_map = {}
    for i, shard in enumerate(shards):
        name = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {k: _random(k, s, gen, device, dtype).cpu() for k, s in shard.items()}
        save_file(tensors, str(folder / (name + ".tmp")), metadata={"format": "pt"})
        os.replace(folder / (name + ".tmp"), folder / name)
        weight_map.update({k: name for k in shard})
        del tensors
    if len(shards) > 1:
        atomic_write_text(folder / "model.safetensors.index.json",
                          json.dumps({"metadata": {}, "weight_map": weight_map}))
    for stem, keys in (("action_head", head), ("proprio_projector", proprio)) if oft_components else ():
        if keys:  # saved from DDP-wrapped modules, as OFT's finetune.py does
            state = {f"module.{k}": _random(k, s, gen, device, dtype).cpu() for k, s in keys.items()}
            torch.save(state, folder / f"{stem}--{step}_checkpoint.pt")
    stats = {unnorm_key: libero_statistics(action_dim, proprio_dim or 8)}
    if oft_components:
        atomic_write_text(folder / "dataset_statistics.json", json.dumps(stats, indent=2))
    atomic_write_text(folder / "config.json", json.dumps({**config, "norm_stats": stats}, indent=2))
    write_tokenizer(folder, PROMPT_WORDS + (words or []))
    return folder


# tiny towers in the official layouts: the tests build, load and run them in seconds
TINY_VISION = {"vit_large_patch14_reg4_dinov2.lvd142m": {"embed_dim": 32, "depth": 3, "num_heads": 2, "mlp_dim": 64},
               "vit_so400m_patch14_siglip_224": {"embed_dim": 48, "depth": 3, "num_heads": 2, "mlp_dim": 80}}
TINY_TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 4, "vocab_size": 256}


# openpi's π0 state-dict names (PI0Pytorch, saved with safetensors' save_model), per layer where N appears
PI0 = "paligemma_with_expert."
PI0_VISION = PI0 + "paligemma.model.vision_tower.vision_model."
PI0_LAYER = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
             "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight",
             "post_attention_layernorm.weight")


def pi0_official_shapes(vision=(32, 1, 64), lm=(64, 2, 128), expert=(32, 64), heads=(2, 1, 32), patch=14,
                        image=28, vocab=64, action_dim=32) -> dict[str, tuple]:
    """Every key of openpi's π0 ``model.safetensors`` with its shape, at the given (small) sizes."""
    (vw, vd, vm), (lw, depth, lmlp), (ew, emlp), (h, kv, hd) = vision, lm, expert, heads
    shapes = {PI0_VISION + "embeddings.patch_embedding.weight": (vw, 3, patch, patch),
              PI0_VISION + "embeddings.patch_embedding.bias": (vw,),
              PI0_VISION + "embeddings.position_embedding.weight": ((image // patch) ** 2, vw),
              PI0_VISION + "post_layernorm.weight": (vw,), PI0_VISION + "post_layernorm.bias": (vw,),
              PI0 + "paligemma.model.multi_modal_projector.linear.weight": (lw, vw),
              PI0 + "paligemma.model.multi_modal_projector.linear.bias": (lw,),
              PI0 + "paligemma.lm_head.weight": (vocab, lw),
              PI0 + "paligemma.model.language_model.norm.weight": (lw,),
              PI0 + "gemma_expert.model.norm.weight": (ew,), PI0 + "gemma_expert.lm_head.weight": (vocab, ew),
              "action_in_proj.weight": (ew, action_dim), "action_in_proj.bias": (ew,),
              "action_out_proj.weight": (action_dim, ew), "action_out_proj.bias": (action_dim,),
              "state_proj.weight": (ew, action_dim), "state_proj.bias": (ew,),
              "action_time_mlp_in.weight": (ew, 2 * ew), "action_time_mlp_in.bias": (ew,),
              "action_time_mlp_out.weight": (ew, ew), "action_time_mlp_out.bias": (ew,)}
    for n in range(vd):
        b = PI0_VISION + f"encoder.layers.{n}."
        for norm in ("layer_norm1", "layer_norm2"):
            shapes.update({b + f"{norm}.weight": (vw,), b + f"{norm}.bias": (vw,)})
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes.update({b + f"self_attn.{proj}.weight": (vw, vw), b + f"self_attn.{proj}.bias": (vw,)})
        shapes.update({b + "mlp.fc1.weight": (vm, vw), b + "mlp.fc1.bias": (vm,), b + "mlp.fc2.weight": (vw, vm),
                       b + "mlp.fc2.bias": (vw,)})
    for prefix, width, mlp in ((PI0 + "paligemma.model.language_model.layers.", lw, lmlp),
                               (PI0 + "gemma_expert.model.layers.", ew, emlp)):
        own = {"self_attn.q_proj.weight": (h * hd, width), "self_attn.k_proj.weight": (kv * hd, width),
               "self_attn.v_proj.weight": (kv * hd, width), "self_attn.o_proj.weight": (width, h * hd),
               "mlp.gate_proj.weight": (mlp, width), "mlp.up_proj.weight": (mlp, width),
               "mlp.down_proj.weight": (width, mlp), "input_layernorm.weight": (width,),
               "post_attention_layernorm.weight": (width,)}
        for n in range(depth):
            shapes.update({f"{prefix}{n}.{k}": v for k, v in own.items()})
    return shapes


def write_pi0_checkpoint(folder: str | Path, state_dim: int, action_dim: int, words: list[str], seed: int = 0,
                         asset_id: str = "physical-intelligence/libero") -> Path:
    """A tiny π0 folder in openpi's PyTorch layout (random weights; config.json names the tiny test variants and
    the tiny vocabulary) with a word-level tokenizer of ``words``."""
    import json

    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_tokenizer(folder, words)
    vocab = len(json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"])
    gen = torch.Generator().manual_seed(seed)
    shapes = pi0_official_shapes(vocab=vocab)
    save_file({k: _random(k, s, gen, "cpu", torch.float32).contiguous() for k, s in shapes.items()},
              str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({
        "action_dim": 32, "action_horizon": 5, "paligemma_variant": "gemma_tiny",
        "action_expert_variant": "gemma_tiny_expert", "precision": "float32", "vision_variant": "tiny",
        "vocab_size": vocab}))
    stats = folder / "assets" / asset_id
    stats.mkdir(parents=True)
    part = lambda n, std: {"mean": [0.0] * n, "std": [std] * n, "q01": [-1.0] * n, "q99": [1.0] * n}  # noqa: E731
    (stats / "norm_stats.json").write_text(json.dumps({"norm_stats": {"state": part(state_dim, 0.5),
                                                                      "actions": part(action_dim, 0.3)}}))
    return folder


def write_tiny_oft_checkpoint(folder: str | Path, unnorm_key: str = "libero_object_no_noops", **kw) -> Path:
    """A tiny OpenVLA-OFT folder in the official layout (its weights in several shards)."""
    cfg = official_config(TINY_TEXT, image_size=28, vision_overrides=TINY_VISION)
    return write_official_checkpoint(folder, cfg, unnorm_key, seed=0, shard_bytes=200_000, **kw)


def write_metaworld_oft_checkpoint(folder: str | Path) -> Path:
    """The tiny OpenVLA-OFT folder the MetaWorld RL tests run: 4-dim proprio and actions under MetaWorld's key."""
    return write_tiny_oft_checkpoint(folder, "metaworld", action_dim=4, proprio_dim=4)


def write_metaworld_pi0_checkpoint(folder: str | Path) -> Path:
    """The tiny π0 folder the MetaWorld tests run: 4-dim state and actions, a vocabulary for its instructions."""
    return write_pi0_checkpoint(folder, state_dim=4, action_dim=4,
                                words=PROMPT_WORDS + ["press", "button", "drawer", "a", "the", "and", "it", "in"])


def write_lerobot_pi0_checkpoint(openpi_folder: str | Path, folder: str | Path, untied_embedding: bool = False) -> Path:
    """The tiny openpi π0 folder rewritten as lerobot saves its ``pi0`` policy: openpi's weight names under
    ``model.`` (with ``untied_embedding``, the token embedding also saved under its own name, apart from the
    lm_head, as lerobot does from 0.5), a ``"type": "pi0"`` config.json, the preprocessor pipeline whose normalizer
    step names the statistics file, and the tokenizer in a folder of its own."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    source, folder = Path(openpi_folder), Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {"model." + k: v for k, v in load_file(str(source / "model.safetensors")).items()}
    if untied_embedding:
        lm_head = state["model." + PI0 + "paligemma.lm_head.weight"]
        state["model." + PI0 + "paligemma.model.language_model.embed_tokens.weight"] = lm_head + 1.0
    save_file(state, str(folder / "model.safetensors"))
    openpi = json.loads((source / "config.json").read_text())
    stats = json.loads(next((source / "assets").glob("**/norm_stats.json")).read_text())["norm_stats"]
    state_dim, action_dim = len(stats["state"]["mean"]), len(stats["actions"]["mean"])
    (folder / "config.json").write_text(json.dumps({
        "type": "pi0", "n_obs_steps": 1, "chunk_size": openpi["action_horizon"],
        "n_action_steps": openpi["action_horizon"], "max_state_dim": 32, "max_action_dim": openpi["action_dim"],
        "paligemma_variant": openpi["paligemma_variant"], "action_expert_variant": openpi["action_expert_variant"],
        "vision_variant": openpi["vision_variant"], "vocab_size": openpi["vocab_size"], "dtype": "float32",
        "input_features": {"observation.state": {"type": "STATE", "shape": [state_dim]}},
        "output_features": {"action": {"type": "ACTION", "shape": [action_dim]}},
        "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}}))
    stats_file = "policy_preprocessor_step_6_normalizer_processor.safetensors"
    tensors = {f"{feature}.{stat}": torch.tensor(stats[part][stat], dtype=torch.float32)
               for part, feature in (("state", "observation.state"), ("actions", "action"))
               for stat in ("mean", "std", "q01", "q99")}
    tensors["timestamp.mean"] = torch.zeros(1)  # lerobot saves every feature's statistics, not only the model's
    save_file(tensors, str(folder / stats_file))
    (folder / "policy_preprocessor.json").write_text(json.dumps({"name": "policy_preprocessor", "steps": [
        {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
        {"registry_name": "normalizer_processor", "state_file": stats_file,
         "config": {"eps": 1e-8, "norm_map": {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}}}]}))
    (folder / "tokenizer").mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (source / name).exists():
            shutil.copy(source / name, folder / "tokenizer" / name)
    return folder
