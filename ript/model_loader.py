"""Build any registered model from a checkpoint directory.

``config.json`` names the stage, the registered model and its constructor kwargs; the weights are checked
against the rebuilt model so a checkpoint of another stage or architecture is refused with a clear message.
Two weight formats: ``full`` (every weight in ``model.safetensors``) and ``adapter`` (a model built from an
external base folder, e.g. OpenVLA-OFT's official one, plus the peft adapter and heads in ``adapter/``).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch

import ript.models  # noqa: F401  (registers the models)
from ript.errors import RiptError
from ript.registry import MODELS
from ript.utils.checkpoint import load_weights, read_checkpoint_config, resolve_checkpoint_dir


def build_model(config: dict[str, Any]) -> torch.nn.Module:
    return MODELS.build(config["model_name"], **config["model_kwargs"])


def check_and_load(model: torch.nn.Module, state: dict[str, torch.Tensor], where: str, strict: bool = True) -> None:
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if strict and (missing or unexpected):
        detail = f"missing key {missing[0]!r}" if missing else f"unexpected key {unexpected[0]!r}"
        raise RiptError(f"{where}: weights do not fit the model ({detail}; {len(missing)} missing, "
                        f"{len(unexpected)} unexpected)")
    for k, v in state.items():
        if k in own and own[k].shape != v.shape:
            raise RiptError(f"{where}: key {k!r} has shape {tuple(v.shape)}, model expects {tuple(own[k].shape)}")
    model.load_state_dict({k: v for k, v in state.items() if k in own}, strict=strict)


def load_model(
    path: str | Path,
    expect_stage: str | tuple[str, ...] | None = None,
    device: str | torch.device = "cpu",
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Load (model, checkpoint config) from a run dir, ``checkpoints/last`` or one step's folder."""
    ckpt = resolve_checkpoint_dir(path)
    config = read_checkpoint_config(ckpt)
    for key in ("stage", "model_name", "model_kwargs"):
        if key not in config:
            raise RiptError(f"{ckpt}/config.json has no {key!r}: not a ript checkpoint")
    if expect_stage is not None:
        allowed = (expect_stage,) if isinstance(expect_stage, str) else expect_stage
        if config["stage"] not in allowed:
            raise RiptError(
                f"{ckpt}: checkpoint is from stage {config['stage']!r} (model {config['model_name']!r}), "
                f"but a {' or '.join(allowed)} checkpoint is needed here"
            )
    weights_format = config.get("weights_format", "full")
    if weights_format == "adapter":
        from ript.models.openvla_oft.lora import load_adapter

        model = MODELS.build(config["model_name"], device=str(device), **config["model_kwargs"])
        load_adapter(model, ckpt / "adapter", merge=True)  # merged: inference runs without peft
        return model, {**config, "checkpoint_dir": str(ckpt)}
    if weights_format == "trainable":  # what RL trained, over the model its kwargs rebuild from an official folder
        model = MODELS.build(config["model_name"], device=str(device), **config["model_kwargs"])
        state = load_weights(ckpt)
        extra = sorted(set(state) - set(model.state_dict()))
        if extra:
            raise RiptError(f"{ckpt / 'model.safetensors'}: key {extra[0]!r} is not one of the model's")
        check_and_load(model, state, str(ckpt / "model.safetensors"), strict=False)
        return model, {**config, "checkpoint_dir": str(ckpt)}
    if weights_format != "full":
        raise RiptError(f"{ckpt}/config.json: unknown weights_format {weights_format!r} (full, adapter or trainable)")
    model = build_model(config)
    check_and_load(model, load_weights(ckpt), str(ckpt / "model.safetensors"))
    return model.to(device), {**config, "checkpoint_dir": str(ckpt)}


# the weights that condition a model on its own tasks (the instructions' embeddings, or a learned task table): a
# model adapted to other tasks keeps its own
PER_TASK_WEIGHTS = ("task_embeddings", "task_table")


def start_from(model: torch.nn.Module, kwargs: dict, path: str, stage: str, other_tasks: bool = False) -> str:
    """``model``, built from ``kwargs``, takes the weights of the ``stage`` checkpoint at ``path`` (a run's
    ``init_checkpoint``), which must have been built with the same ``kwargs``; with ``other_tasks`` its tasks may
    differ and the model keeps its own ``PER_TASK_WEIGHTS``. Returns the checkpoint's folder."""
    try:
        source, config = load_model(path, expect_stage=stage)
    except RiptError as e:
        raise RiptError(f"init_checkpoint: {e}") from None
    # a setting added to the model since the checkpoint was written is missing from its record: it was built, and
    # loads, with the constructor's default
    defaults = {name: p.default for name, p in inspect.signature(type(model).__init__).parameters.items()
                if p.default is not inspect.Parameter.empty}
    theirs = {**defaults, **config["model_kwargs"]}
    changed = next((k for k in kwargs if not (other_tasks and k == "task_names") and theirs.get(k) != kwargs[k]),
                   None)
    if changed is not None:
        raise RiptError(f"init_checkpoint={path} has {changed}={theirs.get(changed)!r}; this run builds "
                        f"{changed}={kwargs[changed]!r} (a {stage} run starts only from a checkpoint of its own "
                        f"shape)")
    state = source.state_dict()
    if other_tasks:
        state = {k: v for k, v in state.items() if not k.startswith(PER_TASK_WEIGHTS)}
    model.load_state_dict(state, strict=not other_tasks)
    return config["checkpoint_dir"]
