"""The flow-matching chunk policy: per decision, the prefix once, then K denoise steps of the action expert from
Gaussian noise; deterministic (the ODE) in evaluation, stochastic as RL's noise method says while RL samples
(``ript.models.flow_denoise``). A decision is one CUDA graph on a GPU, as the skill prior's."""

from __future__ import annotations

import numpy as np
import torch

from ript.errors import RiptError
from ript.models.flow import FlowPolicyModel
from ript.models.flow_denoise import Denoising, denoise, stochastic_steps
from ript.policies.observation_policy import ObservationPolicy

EVAL_NOISE = ("sampled", "zero")


class FlowPolicy(ObservationPolicy):
    def __init__(self, model: FlowPolicyModel, denoising: Denoising, action_horizon: int, device="cpu", seed: int = 0,
                 amp: bool = False, cuda_graph: bool = True, deterministic: bool = True, eval_noise: str = "sampled",
                 action_dim: int | None = None, frame_stack: int | None = None, obs_keys: list[str] | None = None):
        if not 1 <= action_horizon <= model.chunk_size:
            raise RiptError(f"action_horizon={action_horizon} must be in [1, chunk_size={model.chunk_size}]")
        if eval_noise not in EVAL_NOISE:
            raise RiptError(f"eval_noise={eval_noise!r}; choose one of {', '.join(EVAL_NOISE)}")
        super().__init__(model.eval().to(device), action_dim or model.action_dim, action_horizon, device, seed,
                         cuda_graph, frame_stack, obs_keys)
        self.denoising, self.eval_noise = denoising, eval_noise
        self.amp = amp and self.device.type == "cuda"
        self.set_deterministic(deterministic)

    def model_inputs(self, obs: dict[str, torch.Tensor], task_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """What ``model.encode`` reads, from a batch of frame stacks and task ids (RL's update too)."""
        return {"obs": obs, "task_ids": task_ids}

    def env_actions(self, chunks: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The executed part of normalised chunks (B, C, A) in the env's units (``inputs``: the model's)."""
        return self.model.action_normalizer.unnormalize(chunks[:, : self.action_horizon])

    def _infer(self, obs: dict[str, torch.Tensor], task_ids: torch.Tensor, noise: torch.Tensor, picks: torch.Tensor):
        """-> (prefix features, chain, stochastic steps, per-element log-probs of the executed actions, actions,
        values)."""
        model, settings = self.model, self.denoising
        inputs = self.model_inputs(obs, task_ids)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp, cache_enabled=False):
            prefix = model.encode(**inputs)
            stochastic = stochastic_steps(settings, len(noise), picks, self.deterministic, noise.device)
            chain, log_prob, hidden = denoise(model, prefix.cache, noise, settings, stochastic)
        features = prefix.features.float()
        values = features.new_zeros(len(features)) if self.critic is None else self.critic(features, hidden)
        log_probs = log_prob[:, : self.action_horizon, : self.action_dim].flatten(1)
        actions = self.env_actions(chain[:, -1], inputs).float()
        return features, chain, stochastic, log_probs, actions, values.float()

    def _draws(self, envs: list[int], rows: list[int]) -> dict[str, torch.Tensor]:
        """Each env's initial noise, step noise and stochastic step, from its episode's stream, laid out by row."""
        shape = (self.denoising.steps + 1, self.model.chunk_size, self.model.action_dim)
        if self.deterministic and self.eval_noise == "zero":
            noise = torch.zeros((len(envs), *shape), device=self.device)
        else:
            noise = self.env_draws(envs, lambda g: torch.randn(shape, device=self.device, generator=g))
        first = self.denoising.picked_from
        picks = self.env_draws(envs, lambda g: torch.randint(0, first, (), device=self.device, generator=g))
        order = [envs.index(i) for i in rows]  # every row reads one of envs
        return {"noise": noise[order], "picks": picks[order]}

    def state_values(self, envs: list[int]) -> torch.Tensor:
        """The critic's values of these envs' states; a critic after the action expert reads an ODE chain from
        zero noise (the state's value does not depend on a decision's draws)."""
        rows, picked = self._layout(envs)
        _, inputs = self._inputs(rows)
        shape = (len(rows), self.denoising.steps + 1, self.model.chunk_size, self.model.action_dim)
        stochastic = torch.zeros(len(rows), self.denoising.steps, dtype=torch.bool, device=self.device)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
            prefix = self.model.encode(**self.model_inputs(inputs["obs"], inputs["task_ids"]))
            _, _, hidden = denoise(self.model, prefix.cache, torch.zeros(shape, device=self.device), self.denoising,
                                   stochastic)
        return self.critic(prefix.features.float(), hidden)[picked]

    @torch.no_grad()
    def plan(self, envs: list[int]) -> np.ndarray:
        rows, picked = self._layout(envs)
        host_obs, inputs = self._inputs(rows)
        inputs.update(self._draws(envs, rows))
        outputs = self._decide(inputs)
        picked_rows = torch.tensor(picked, device=self.device)
        features, chain, stochastic, log_probs, actions, values = (x.index_select(0, picked_rows) for x in outputs)
        if self.record:
            # what RL's update rescoring needs: the prefix features, or the observations the prefix is encoded from
            # again. Each record holds its row of the picked outputs (index_select copied them out of the graph's
            # buffers, which its next replay overwrites)
            frames = self.recorded_frames(host_obs, picked, envs)
            for j, i in enumerate(envs):
                record = {"chain": chain[j], "stochastic": stochastic[j], "log_probs": log_probs[j]}
                if self.critic is not None:
                    record["value"] = values[j]
                if frames is not None:
                    record.update(frames[j])
                else:
                    record["context"] = features[j]
                self.records[i].append(record)
        return actions.cpu().numpy()  # waits for the GPU
