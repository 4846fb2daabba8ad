"""RL of a flow policy (πRL): the recorded denoise chains rescored by the current action expert, Flow-Noise's
joint log-prob of every step or Flow-SDE's of its stochastic step, per action element or summed per chunk; the
value head after the expert or after the prefix."""

from __future__ import annotations

from pathlib import Path

import torch

from ript.errors import RiptError
from ript.models.flow_denoise import Denoising, denoise, flow_times, score_chain
from ript.policies.flow_policy import FlowPolicy
from ript.rl.critic import FlowValueHead
from ript.rl.learners import Scored, TrainableWeights, collate_conditioning
from ript.utils.training import train_only

LOG_PROB_LEVELS = ("element", "chunk")


class FlowLearner:
    """``expert_only`` (πRL's setting): only the action expert and its noise head train, and the update reads the
    recorded prefix; otherwise the prefix and observation encoders train too, recomputed from the observations."""
    compiles_update = False
    evaluation_shift_measured = True  # evaluation integrates the ODE
    regresses_chunks = True  # the flow-matching loss toward the executed chunk

    def __init__(self, model, denoising: Denoising, action_horizon: int, expert_only: bool, log_prob_level: str,
                 critic_cfg=None, critic_position: str = "expert", trainable_only: bool = False,
                 regression: bool = False, demos: bool = False):
        if log_prob_level not in LOG_PROB_LEVELS:
            raise RiptError(f"policy.log_prob_level={log_prob_level!r}; choose one of {', '.join(LOG_PROB_LEVELS)}")
        self.model, self.denoising, self.horizon, self.level = model, denoising, action_horizon, log_prob_level
        # what scoring runs on the model and the model on its layers, besides forward (rl.fsdp gathers around them)
        self.sharded_methods = ("encode", "expert", "noise_std", *(("cache_from",) if model.rescores_from_features
                                                                     else ()))
        self.sharded_layer_methods = model.layer_methods
        train_only(model, model.expert_parameters() if expert_only else model.parameters())
        self.params = [p for p in model.parameters() if p.requires_grad]
        # checkpoints hold the whole model, or (a big model over its official folder) only what RL trains
        self.weights = TrainableWeights(model) if trainable_only else model
        self.expert_only = expert_only
        self.regression = regression  # score gives chunk_errors too, from the prefix it has computed
        self.imitates_demos = demos  # the model is one trained here on demos, with their loss (not π0's folder)
        # the update encodes the recorded observations again when the prefix trains, or when the expert's cache
        # cannot be rebuilt from a few recorded features (π0's is every layer's keys and values)
        self.encodes = not expert_only or not model.rescores_from_features
        width = model.expert_width if critic_position == "expert" else model.prefix_width
        self.critic = None if critic_cfg is None else FlowValueHead(
            width, int(critic_cfg.hidden), bool(critic_cfg.detach_input), critic_position,
        ).to(next(model.parameters()).device)
        self.policy: FlowPolicy | None = None  # whose model_inputs turn recorded observations into the model's

    def attach(self, policy: FlowPolicy) -> None:
        self.policy = policy
        policy.attach_critic(self.critic)
        policy.start_recording(observations=self.encodes)

    def write_extra(self, folder: Path, whole: dict[str, torch.Tensor] | None = None) -> None:
        """Nothing beyond the weights: the checkpoint holds the whole flow policy."""

    def _level(self, log_probs: torch.Tensor) -> torch.Tensor:
        """Per-element log-probs (N, horizon * A) as the ratio reads them: each element, or the chunk's sum."""
        return log_probs.sum(1, keepdim=True) if self.level == "chunk" else log_probs

    def collate(self, decisions: list[dict], device: str) -> dict:
        return {"chain": torch.stack([d["chain"] for d in decisions]).to(device),
                "stochastic": torch.stack([d["stochastic"] for d in decisions]).to(device),
                "old_log_probs": self._level(torch.stack([d["log_probs"] for d in decisions]).float()).to(device),
                **collate_conditioning(decisions, device, self.encodes)}

    def _prefix(self, data: dict, idx: torch.Tensor) -> tuple[torch.Tensor, object]:
        """(prefix features, the expert's cache) of the decisions ``idx``."""
        model = self.model
        if not self.encodes:
            features = data["context"][idx]
            return features, model.cache_from(features)
        inputs = self.policy.model_inputs({k: v[idx] for k, v in data["obs"].items()}, data["task_ids"][idx])
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.expert_only):
            prefix = model.encode(**inputs)
        return prefix.features, prefix.cache

    def score(self, data: dict, idx: torch.Tensor) -> Scored:
        features, cache = self._prefix(data, idx)
        every_step = self.critic is not None and self.critic.position == "expert"
        log_prob, entropy, hidden = score_chain(self.model, cache, data["chain"][idx], data["stochastic"][idx],
                                                self.denoising, every_step)
        values = None if self.critic is None else self.critic(features.float(), hidden)
        executed = log_prob[:, : self.horizon, : self.policy.action_dim].flatten(1)
        errors = self._chunk_errors(data, idx, cache) if self.regression else None
        return Scored(self._level(executed), entropy, values, errors)

    def evaluation_actions(self, data: dict, idx: torch.Tensor) -> torch.Tensor:
        """The ODE's executed chunk from each recorded chain's initial noise (normalised units): what evaluation
        runs. With one stochastic step per chain the ratio sees only that step; the deterministic steps move too,
        through the weights every step shares."""
        _, cache = self._prefix(data, idx)
        chain = data["chain"][idx]
        ode = torch.zeros(chain.shape[0], self.denoising.steps, dtype=torch.bool, device=chain.device)
        final = denoise(self.model, cache, chain, self.denoising, ode)[0][:, -1]
        return final[:, : self.horizon, : self.policy.action_dim].flatten(1).float()

    def chunk_regression(self, data: dict, idx: torch.Tensor) -> torch.Tensor:
        """Each decision's flow-matching loss (N,) toward the chunk it executed, alone (``score`` gives it beside the
        log-probs, from the same prefix, when the learner is built with ``regression``)."""
        return self._chunk_errors(data, idx, self._prefix(data, idx)[1])

    def _chunk_errors(self, data: dict, idx: torch.Tensor, cache) -> torch.Tensor:
        """The flow-matching loss toward each executed chunk (its chain's last state), on the line from the chain's
        own initial noise, at the K times the evaluation ODE visits: the velocity field evaluation integrates is
        trained directly, where the ratio sees only the scored steps. No fresh noise or times are drawn, so the
        update stays a function of the recorded decisions (resumes are exact)."""
        recorded = data["chain"][idx]
        noise, chunk = recorded[:, 0].float(), recorded[:, -1].float()
        target = (noise - chunk)[:, : self.horizon, : self.policy.action_dim]
        errors = []
        for tau in flow_times(self.denoising.steps, recorded.device)[:-1]:
            taus = tau.expand(recorded.shape[0])
            # the expert sees points in the dtype the recorded chain has, as scoring gives it the chain's own
            velocity, _ = self.model.expert((tau * noise + (1 - tau) * chunk).to(recorded.dtype), taus, cache)
            errors.append((velocity.float()[:, : self.horizon, : self.policy.action_dim] - target).pow(2).mean((1, 2)))
        return torch.stack(errors, 1).mean(1)
