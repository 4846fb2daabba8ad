"""The QueST-style chunk policy: the skill prior samples a sequence of skill tokens from the envs' frame stacks,
the autoencoder's decoder turns them into a chunk of actions. On a GPU each decision replays as one CUDA
graph (eagerly it is ~1,300 small kernel launches).
"""

from __future__ import annotations

import numpy as np
import torch

from ript.models.prior import SkillPrior
from ript.policies.observation_policy import ObservationPolicy


class ChunkPolicy(ObservationPolicy):
    def __init__(
        self,
        model: SkillPrior,
        action_horizon: int = 8,
        temperature: float = 1.0,
        top_k: int | None = None,
        greedy: bool = False,
        device: str | torch.device = "cpu",
        seed: int = 0,
        amp: bool = False,
        record: bool = False,
        cuda_graph: bool = True,
    ):
        chunk = model.autoencoder.chunk_size
        if not 1 <= action_horizon <= chunk:
            raise ValueError(f"action_horizon={action_horizon} must be in [1, chunk_size={chunk}]")
        super().__init__(model.eval().to(device), model.autoencoder.action_dim, action_horizon, device, seed,
                         cuda_graph)
        self.sampling = {"temperature": temperature, "top_k": top_k}
        self.set_deterministic(greedy)  # greedy: each token's most likely value
        self.amp = amp and self.device.type == "cuda"
        if record:
            self.start_recording()

    def _infer(self, obs: dict[str, torch.Tensor], task_ids: torch.Tensor, noise: torch.Tensor | None = None):
        """Observations -> (context, tokens, log-probs, action chunks, values); no host synchronisation inside.
        Values are the critic's (zeros without one)."""
        model = self.model
        # autocast's weight-cast cache must stay off for CUDA-graph capture
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp, cache_enabled=False):
            context = model.context(obs, task_ids)
            tokens, log_probs = model.sample(context, noise=noise, greedy=self.deterministic, **self.sampling)
            chunks = model.autoencoder.action_normalizer.unnormalize(model.autoencoder.decode_indices(tokens).float())
        context = context.float()
        values = context.new_zeros(len(context)) if self.critic is None else self.critic(context)
        return context, tokens, log_probs, chunks[:, : self.action_horizon].float(), values.float()

    def state_values(self, envs: list[int]) -> torch.Tensor:
        rows, picked = self._layout(envs)
        _, inputs = self._inputs(rows)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
            context = self.model.context(inputs["obs"], inputs["task_ids"])
        return self.critic(context.float())[picked]

    @torch.no_grad()
    def plan(self, envs: list[int]) -> np.ndarray:
        rows, picked = self._layout(envs)
        host_obs, inputs = self._inputs(rows)
        if not self.deterministic:
            noise = self.env_draws(envs, lambda g: self.model.sampling_noise(1, self.device, g)[0])
            inputs["noise"] = noise[[envs.index(i) for i in rows]]  # every row reads one of envs
        outputs = self._decide(inputs)
        picked_rows = torch.tensor(picked, device=self.device)  # one small copy for all five outputs
        context, tokens, log_probs, chunks, values = (x.index_select(0, picked_rows) for x in outputs)
        if self.record:
            # what RL training needs, so it recomputes only the prior: context, sampled tokens, old log-probs. Each
            # record holds its row of the picked outputs (index_select copied them out of the graph's buffers, which
            # its next replay overwrites)
            frames = self.recorded_frames(host_obs, picked, envs)
            for j, i in enumerate(envs):
                record = {"context": context[j], "tokens": tokens[j], "log_probs": log_probs[j]}
                if self.critic is not None:
                    record["value"] = values[j]
                if frames is not None:
                    record.update(frames[j])
                self.records[i].append(record)
        return chunks.cpu().numpy()  # waits for the GPU
