"""Learners: what the RL loop needs from a policy family, behind one protocol, so the loop is written once.

A learner lists the parameters RL trains, the module whose state checkpoints hold (``weights``), its value
head if it has one (``critic``), attaches to the policy it trains (``attach``: the policy then records what the
update reads, with the critic's values), collates the recorded decisions of a batch of rollouts, and scores them
under the current parameters: log-probs, entropy and (with a critic) values.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from omegaconf import OmegaConf

from ript.errors import RiptError
from ript.policies.base import ChunkingPolicy
from ript.policies.chunk_policy import ChunkPolicy
from ript.rl.critic import AttentionPoolValueHead, ContextValueHead
from ript.rl.objective import token_scores
from ript.utils import training


@dataclass
class Scored:
    """A batch of recorded decisions scored by the current parameters."""
    log_probs: torch.Tensor          # (N, T): per token / action dimension
    entropy: torch.Tensor            # (N,): the distribution's mean entropy per token / action dimension
    values: torch.Tensor | None      # (N,): the critic's, when the learner has one
    chunk_errors: torch.Tensor | None = None  # (N,): each decision's imitation loss toward the chunk it executed,
                                              # when the learner was built to give it (rl.flow_matching_coef)


class Learner(Protocol):
    model: torch.nn.Module       # the policy's model (train/eval mode is switched around the update)
    params: list[torch.nn.Parameter]  # the policy's trainable parameters (the critic's are apart)
    weights: torch.nn.Module     # what RL checkpoints hold
    critic: torch.nn.Module | None  # the value head (advantage=gae), saved as critic.safetensors
    sharded_methods: tuple[str, ...]  # the model's methods besides forward that scoring calls (rl.fsdp gathers
                                      # the model's own weights around each)
    sharded_layer_methods: tuple[str, ...]  # its layers' methods besides forward that the model calls (the same,
                                            # for each layer's weights)
    compiles_update: bool  # scoring runs through torch.compile (rl.compile_ahead can compile it ahead)
    evaluation_shift_measured: bool  # ``evaluation_actions`` gives what evaluation executes (not RL's samples)
    regresses_chunks: bool  # ``score`` can give ``chunk_errors`` (a flow policy's flow-matching loss)
    imitates_demos: bool  # the model has the flow-matching loss of its own imitation stage (rl.demo_coef)

    def attach(self, policy: ChunkingPolicy) -> None: ...  # the policy records what collate reads; the critic's too
    def collate(self, decisions: list[dict], device: str) -> dict: ...
    def score(self, data: dict, idx: torch.Tensor) -> Scored: ...
    # the actions an evaluation would execute for decisions idx, (N, ...), where it executes something other than
    # RL's samples (a flow policy's ODE, OFT's Laplace mean): the update measures how far it moved them, which
    # the ratio of the sampled actions may not show; None where evaluation samples the distribution RL scores
    def evaluation_actions(self, data: dict, idx: torch.Tensor) -> torch.Tensor | None: ...
    # further files every RL checkpoint carries; ``whole``: ``weights``' state gathered whole where the model is
    # sharded (rl.fsdp), to read instead of the model's own; else None
    def write_extra(self, folder: Path, whole: dict[str, torch.Tensor] | None = None) -> None: ...


def trainable_parameters(model, prior_only: bool) -> list[torch.nn.Parameter]:
    model.requires_grad_(False)
    parts = [model.gpt, model.tok_emb, model.head] if prior_only else [model]
    for part in parts:
        part.requires_grad_(True)
    model.pos_emb.requires_grad_(True)
    if not prior_only:
        model.autoencoder.requires_grad_(False)  # the decoder stays the stage-0/finetune one
    return [p for p in model.parameters() if p.requires_grad]


def collate_conditioning(decisions: list[dict], device: str, observations: bool) -> dict:
    """What the update conditions on, stacked: the recorded observations and task ids (the encoders run again), or
    the recorded context / prefix features."""
    if observations:
        return {"obs": {k: torch.stack([d["obs"][k] for d in decisions]).to(device) for k in decisions[0]["obs"]},
                "task_ids": torch.tensor([d["task_id"] for d in decisions], device=device)}
    return {"context": torch.stack([d["context"] for d in decisions]).to(device)}


class ChunkLearner:
    """What the RL loop needs from a chunk policy: its trainable parameters, and token log-probs recomputed
    on what was cached at sampling time: the contexts when only the prior trains, else the observations
    (so the gradient reaches the observation encoders)."""
    sharded_methods = ("context", "logits")
    sharded_layer_methods = ()
    evaluation_shift_measured = False  # evaluation samples tokens as RL does, or decodes greedy ones one by one
    regresses_chunks = False
    imitates_demos = False

    def __init__(self, model, settings: dict, prior_only: bool, critic_cfg=None, static_batch: int | None = None,
                 compile_scoring: bool = False):
        self.model, self.settings = model, settings
        self.params = trainable_parameters(model, prior_only)
        self.weights = model  # what checkpoints hold
        self.encodes = not prior_only
        self.critic = None if critic_cfg is None else ContextValueHead(
            model.pos_emb.shape[-1], int(critic_cfg.hidden), bool(critic_cfg.detach_input)).to(model.pos_emb.device)
        # compiled scoring (``rl.compile``): every micro-batch padded to ``static_batch`` rows, so the compiled
        # forward and backward see one shape and replay as CUDA graphs (the eager step is launch-bound)
        self.static_batch = static_batch
        self.compiles_update = static_batch is not None and compile_scoring
        self._scores = self._score_rows
        if static_batch is not None and compile_scoring:
            self._scores = training.CompiledLoss(self._score_rows, OmegaConf.create(
                {"compile": True, "deterministic": False, "cuda_graphs": True}), str(model.pos_emb.device))

    def attach(self, policy: ChunkPolicy) -> None:
        policy.attach_critic(self.critic)
        policy.start_recording(observations=self.encodes)  # the encoders train: their inputs are kept

    def write_extra(self, folder: Path, whole: dict[str, torch.Tensor] | None = None) -> None:
        """Nothing beyond the weights: a chunk-policy checkpoint is complete as it is."""

    def collate(self, decisions: list[dict], device: str) -> dict:
        return {"tokens": torch.stack([d["tokens"] for d in decisions]).to(device),
                "old_log_probs": torch.stack([d["log_probs"] for d in decisions]).float().to(device),
                **collate_conditioning(decisions, device, self.encodes)}

    def _score_rows(self, inputs: dict, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
        context = self.model.context(inputs["obs"], inputs["task_ids"]) if self.encodes else inputs["context"]
        log_probs, entropy = token_scores(self.model, context, tokens, float(self.settings["temperature"]),
                                          self.settings.get("top_k"))
        # a fixed tuple for the compiled graph: without a critic the third slot repeats the entropy, unused
        return log_probs, entropy, entropy if self.critic is None else self.critic(context)

    def score(self, data: dict, idx: torch.Tensor) -> Scored:
        n, scores = len(idx), self._score_rows
        if self.static_batch is not None and n <= self.static_batch:
            idx = torch.cat([idx, idx[-1:].expand(self.static_batch - n)])  # padding rows are cut off below
            scores = self._scores
            torch.compiler.cudagraph_mark_step_begin()  # micro-batches accumulate: each call is a new step
        if self.encodes:
            inputs = {"obs": {k: v[idx] for k, v in data["obs"].items()}, "task_ids": data["task_ids"][idx]}
        else:
            inputs = {"context": data["context"][idx]}
        log_probs, entropy, values = (x[:n] for x in scores(inputs, data["tokens"][idx]))
        return Scored(log_probs, entropy, None if self.critic is None else values)

    def evaluation_actions(self, data: dict, idx: torch.Tensor) -> None:
        """None: not measured. A chunk policy is evaluated sampling the tokens RL scores (approx_kl measures the
        change), or greedy, decoded one token at a time, which the teacher-forced update does not give."""
        return None


class TrainableWeights(torch.nn.Module):
    """The parameters RL trains (LoRA + heads), as one module for checkpoints: its state dict is exactly those."""

    def __init__(self, model):
        super().__init__()
        object.__setattr__(self, "_model", model)  # not a submodule: its frozen weights are not saved

    def _params(self) -> dict[str, torch.nn.Parameter]:
        return {k: p for k, p in self._model.named_parameters() if p.requires_grad}

    def state_dict(self, *args, **kwargs):  # noqa: D102
        return {k: p.detach() for k, p in self._params().items()}

    def load_state_dict(self, state, strict: bool = True):  # noqa: D102
        own = self._params()
        with torch.no_grad():
            for k, v in state.items():
                own[k].copy_(v)


class OFTLearner:
    sharded_methods = ()  # scoring runs the model's forward
    sharded_layer_methods = ()
    compiles_update = False
    evaluation_shift_measured = True  # evaluation executes the Laplace means
    regresses_chunks = False
    imitates_demos = False
    def __init__(self, model, grad_checkpointing: bool, train_action_head: bool, critic_cfg=None,
                 full_finetune: bool = False):
        model.requires_grad_(full_finetune)  # full fine-tuning: every weight trains (with FSDP across GPUs at 7B)
        for name, p in model.named_parameters():
            if "lora_" in name or name.startswith("scale_head."):
                p.requires_grad_(True)
        if train_action_head:
            model.action_head.requires_grad_(True)
        self.model, self.grad_checkpointing, self.train_action_head = model, grad_checkpointing, train_action_head
        if grad_checkpointing:
            model.language_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.weights = TrainableWeights(model)
        self.policy = None  # the OFTPolicy whose forward scores the decisions (attach)
        # the value head pools the action positions' final hidden states (fp32, outside the LoRA'd model)
        self.critic = None if critic_cfg is None else AttentionPoolValueHead(
            model.cfg.llm_dim, int(critic_cfg.hidden), detach_input=bool(critic_cfg.detach_input)).to(
            next(model.projector.parameters()).device)

    def attach(self, policy) -> None:
        self.policy = policy
        policy.attach_critic(self.critic)
        policy.start_recording()

    def write_extra(self, folder: Path, whole: dict[str, torch.Tensor] | None = None) -> None:
        """The LoRA adapter and heads in peft's own format, so every RL checkpoint can be evaluated."""
        from ript.models.openvla_oft.lora import save_adapter

        save_adapter(self.model, folder / "adapter", with_action_head=self.train_action_head, weights=whole)

    def collate(self, decisions: list[dict], device: str) -> dict:
        return {"images": torch.stack([d["images"] for d in decisions]),
                "proprio": None if decisions[0]["proprio"] is None else torch.stack([d["proprio"] for d in decisions]),
                "prompts": [d["prompt"] for d in decisions],
                "actions": torch.stack([d["actions"] for d in decisions]).to(device),
                "old_log_probs": torch.stack([d["log_probs"] for d in decisions]).to(device)}

    def score(self, data: dict, idx: torch.Tensor) -> Scored:
        from ript.models.openvla_oft.model import laplace_log_prob

        rows = idx.cpu()
        inputs = {"images": data["images"][rows], "prompts": [data["prompts"][i] for i in rows.tolist()],
                  "proprio": None if data["proprio"] is None else data["proprio"][rows]}
        # Llama has no dropout: train mode only switches gradient checkpointing on
        self.model.language_model.train(self.grad_checkpointing)
        out = self.policy.forward(inputs)
        self.model.language_model.eval()
        log_probs = laplace_log_prob(data["actions"][idx], out["mean"], out["scale"]).flatten(1)
        entropy = (1 + torch.log(2 * out["scale"].float())).flatten(1).mean(-1)  # a Laplace's, per action dim
        return Scored(log_probs, entropy, None if self.critic is None else self.critic(out["hidden"]))

    def evaluation_actions(self, data: dict, idx: torch.Tensor) -> torch.Tensor:
        """The Laplace means, which evaluation executes."""
        rows = idx.cpu()
        inputs = {"images": data["images"][rows], "prompts": [data["prompts"][i] for i in rows.tolist()],
                  "proprio": None if data["proprio"] is None else data["proprio"][rows]}
        return self.policy.forward(inputs)["mean"].float().flatten(1)


class OpenVLALearner(OFTLearner):
    """The original OpenVLA: LoRA on the decoder, a Categorical policy over each action dimension's bins,
    rescored teacher-forced in one forward; the value head reads the hidden state predicting the first bin."""
    evaluation_shift_measured = False  # greedy bins are evaluated, but not measured (evaluation_actions)

    def __init__(self, model, grad_checkpointing: bool, critic_cfg=None):
        super().__init__(model, grad_checkpointing, train_action_head=False, critic_cfg=critic_cfg)

    def score(self, data: dict, idx: torch.Tensor) -> Scored:
        from ript.policies.openvla_policy import state_hidden

        rows = idx.cpu()
        inputs = {"images": data["images"][rows], "prompts": [data["prompts"][i] for i in rows.tolist()]}
        bins = data["actions"][idx]
        self.model.language_model.train(self.grad_checkpointing)
        logits, hidden = self.policy.score_forward(inputs, bins)
        self.model.language_model.eval()
        log_p = self.policy.bin_log_probs(logits)
        entropy = -(log_p.exp() * log_p).sum(-1).mean(-1)
        values = None if self.critic is None else self.critic(state_hidden(hidden))
        return Scored(log_p.gather(-1, bins.unsqueeze(-1)).squeeze(-1), entropy, values)

    def evaluation_actions(self, data: dict, idx: torch.Tensor) -> None:
        """None: not measured. OpenVLA evaluates its greedy bins, decoded one dimension at a time, which the
        update's teacher-forced forward over the sampled bins does not give."""
        return None


def check_fsdp(cfg) -> None:
    """The settings ``rl.fsdp`` works under, checked before anything loads: a sharded model runs its forwards
    on every rank in step, so nothing may run it on one rank alone."""
    if not cfg.rl.get("fsdp"):
        return
    why = None
    from ript.rl.placement import rolls_out_remotely

    if not rolls_out_remotely(cfg):
        why = "set placement.mode=disaggregated (or hybrid): the rollouts then run on a rollout actor's whole copy"
    elif int(cfg.eval.every):
        why = "set eval.every=0 and evaluate its checkpoints with `ript eval`: rank 0 alone cannot run it"
    elif cfg.rl.get("target_eval_shift") is not None:
        why = "rl.target_eval_shift is not measured on a sharded model; use rl.target_kl"
    elif cfg.rl.get("overlap") or float(cfg.rl.get("kl_coef") or 0.0):
        why = "rl.overlap and rl.kl_coef keep whole copies of the weights; leave them off"
    elif cfg.environment.get("refresh_every"):
        why = "environment.refresh_every rolls out with the trainer's own model; leave it off"
    if why:
        raise RiptError(f"rl.fsdp=true: {why}")


def shard_learner(learner) -> None:
    """``rl.fsdp``: the learner's model sharded over the ranks (``ript.utils.fsdp``); the parameters it trains
    become their shards (sharding replaces them)."""
    from ript.utils.fsdp import same_parameters, shard_model

    names = {id(p): n for n, p in learner.model.named_parameters()}
    before = learner.params
    shard_model(learner.model, learner.sharded_methods, learner.sharded_layer_methods)
    learner.params = same_parameters(learner.model, before, names)


def check_same_start(learner, info) -> None:
    """Ranks that only average their gradients never bring together weights that start apart: before the first
    update every rank's trained tensors (the critic's too) are compared with rank 0's, by their sum and norm
    (computed without a float64 copy of a large embedding); a difference is one line naming the first such
    tensor, on every rank."""
    if info.world_size == 1:
        return
    from ript.utils import distributed as ddist

    names = {id(p): n for n, p in learner.model.named_parameters()}
    named = [(names.get(id(p), "a trained tensor"), p) for p in learner.params]
    if learner.critic is not None:
        named += [(f"critic.{n}", p) for n, p in learner.critic.named_parameters()]
    with torch.no_grad():
        prints = torch.tensor([[p.sum(dtype=torch.float64).item(), torch.linalg.vector_norm(p).item()]
                               for _, p in named], dtype=torch.float64)
    everyone = ddist.gather_objects(prints, info)
    for rank, theirs in enumerate(everyone[1:], start=1):
        differ = (theirs != everyone[0]).any(1).nonzero()
        if len(differ):
            raise RiptError(f"{named[int(differ[0, 0])][0]}: rank {rank} starts from other weights than rank 0 "
                            f"(each rank's fresh weights must come from the run's seed, not the rank's)")
