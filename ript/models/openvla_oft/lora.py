"""LoRA on OpenVLA-OFT's Llama decoder through peft, and the adapter folder RL checkpoints carry
(peft's ``adapter_config.json`` + ``adapter_model.safetensors``, and ``heads.safetensors`` for the heads RL adds)."""

from __future__ import annotations

from pathlib import Path

import torch

from ript.errors import RiptError


def add_lora(model, lora_cfg) -> None:
    """LoRA adapters on the Llama decoder through peft (the towers and projector stay frozen)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=int(lora_cfg.rank), lora_alpha=float(lora_cfg.alpha), lora_dropout=0.0,
                        target_modules=list(lora_cfg.target_modules), init_lora_weights=True)
    model.language_model = get_peft_model(model.language_model, config)


def save_adapter(model, folder: str | Path, with_action_head: bool = False,
                 weights: dict[str, torch.Tensor] | None = None) -> None:
    """peft's adapter files (adapter_config.json, adapter_model.safetensors) plus the heads RL trains: the
    scale head, and the action head when RL trains it too. ``weights``: the model's parameters by name, read
    instead of the model's own (a model sharded with FSDP holds only its shards; these are gathered whole)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    if weights is None:
        model.language_model.save_pretrained(str(folder))
        weights = {f"scale_head.{k}": v for k, v in (model.scale_head.state_dict().items() if model.scale_head
                                                    else [])}
        if with_action_head:
            weights.update({f"action_head.{k}": v for k, v in model.action_head.state_dict().items()})
    else:
        save_lora_from(model.language_model, weights, folder)
    heads = {k: v for k, v in weights.items()
             if k.startswith("scale_head.") or (with_action_head and k.startswith("action_head."))}
    save_file({k: v.detach().contiguous().cpu() for k, v in heads.items()}, str(folder / "heads.safetensors"))


def save_lora_from(language_model, weights: dict[str, torch.Tensor], folder: Path) -> None:
    """The files peft's ``save_pretrained`` writes for ``language_model``'s adapter, from ``weights`` (the whole
    model's parameters by name): the adapter's tensors under peft's names, and its config as saved for
    inference."""
    import copy

    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    prefix = "language_model."
    own = {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}
    adapter = get_peft_model_state_dict(language_model, state_dict=own)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in adapter.items()}, str(folder / "adapter_model.safetensors"))
    config = copy.deepcopy(language_model.peft_config["default"])
    config.inference_mode = True
    base = type(language_model.get_base_model())  # named where no task type does it, as peft does
    mapping = {"base_model_class": base.__name__, "parent_library": base.__module__} if config.task_type is None \
        else None
    config.save_pretrained(str(folder), auto_mapping_dict=mapping)


def load_adapter(model, folder: str | Path, merge: bool = False) -> None:
    """Attach a saved adapter (and heads) to a freshly loaded official model; ``merge`` folds LoRA into the
    base weights (faster inference, no peft at run time)."""
    from peft import PeftModel
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / "adapter_config.json").is_file():
        raise RiptError(f"{folder}: no adapter_config.json (not a saved LoRA adapter)")
    model.language_model = PeftModel.from_pretrained(model.language_model, str(folder))
    if merge:
        model.language_model = model.language_model.merge_and_unload()
    heads = load_file(str(folder / "heads.safetensors")) if (folder / "heads.safetensors").is_file() else {}
    p = next(model.projector.parameters())
    scale = {k.removeprefix("scale_head."): v for k, v in heads.items() if k.startswith("scale_head.")}
    if scale:
        head = model.add_scale_head(scale["model.fc1.weight"].shape[0])
        head.load_state_dict(scale)
        head.to(p.device, p.dtype)
    action = {k.removeprefix("action_head."): v for k, v in heads.items() if k.startswith("action_head.")}
    if action:  # RL trained the action head too (policy.train_action_head=true)
        model.action_head.load_state_dict({k: v.to(p.device, p.dtype) for k, v in action.items()})
