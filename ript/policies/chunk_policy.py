"""The QueST-style chunk policy: the skill prior samples a sequence of skill tokens from the envs' frame stacks,
the autoencoder's decoder turns them into a chunk of actions. On a GPU each decision replays as one CUDA
graph (eagerly it is ~1,300 small kernel launches).
"""

from __future__ import annotations

import numpy as np
import torch

from ript.models.prior import SkillPrior
from ript.policies.base import ChunkingPolicy
from ript.utils.logging import log


class ChunkPolicy(ChunkingPolicy):
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
        self.model = model.eval().to(device)
        super().__init__(model.autoencoder.action_dim, action_horizon, model.frame_stack, device, seed,
                         obs_keys=model.image_keys + model.lowdim_keys)
        self.sampling = {"temperature": temperature, "top_k": top_k}
        self.set_deterministic(greedy)  # greedy: each token's most likely value
        self.amp = amp and self.device.type == "cuda"
        if record:
            self.start_recording()
        # one CUDA graph per padded batch size: a decision is ~1,300 small kernels, launch-bound when eager
        self.cuda_graph = cuda_graph and self.device.type == "cuda"
        self.graphs: dict[int, GraphedCall] = {}

    def set_deterministic(self, on: bool) -> None:
        super().set_deterministic(on)
        self.graphs = {}  # a captured decision has the choice baked in

    def reset(self, n_envs: int) -> None:
        super().reset(n_envs)
        self.task_ids = [0] * n_envs

    def start_task(self, i: int, task_name: str) -> None:
        self.task_ids[i] = self.model.task_index(task_name)

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

    def _inputs(self, envs: list[int]) -> tuple[dict, dict]:
        """(host observations, device inputs) of these envs' frame stacks and tasks."""
        host_obs = {
            k: torch.from_numpy(np.stack([np.stack([f[k] for f in self.history[i]]) for i in envs]))
            for k in self.obs_keys
        }
        return host_obs, {"obs": {k: v.to(self.device) for k, v in host_obs.items()},
                          "task_ids": torch.tensor([self.task_ids[i] for i in envs], device=self.device)}

    @property
    def fixed_layout(self) -> bool:
        # a graph's batch has n rows anyway; eagerly, only RL's recorded decisions pay for the padding rows
        return self.record or self.cuda_graph

    def _layout(self, envs: list[int]) -> tuple[list[int], list[int]]:
        """(the env each batch row reads, the rows holding ``envs``' results). With ``fixed_layout``, env i
        always sits in row i of an n-row batch (the other rows repeat ``envs[0]``): a row's result then does
        not depend on which envs were planned with it, which the batch's shape and an env's row otherwise
        move in the last bits (RL's ratio uses the recorded log-probs as they are; resume must match)."""
        if not self.fixed_layout:
            return envs, list(range(len(envs)))
        planned = set(envs)
        return [i if i in planned else envs[0] for i in range(len(self.history))], envs

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
        graphed = self._graph_for(len(self.history), inputs) if self.cuda_graph and not self.model.training else None
        if graphed is not None:
            outputs = graphed(inputs)
        else:
            outputs = self._infer(**inputs)
        picked_rows = torch.tensor(picked, device=self.device)  # one small copy for all five outputs
        context, tokens, log_probs, chunks, values = (x.index_select(0, picked_rows) for x in outputs)
        if self.record:
            # what RL training needs, so it recomputes only the prior: context, sampled tokens, old log-probs
            # (cloned: a graph's outputs are overwritten by its next replay)
            for j, i in enumerate(envs):
                record = {"context": context[j].clone(), "tokens": tokens[j].clone(),
                          "log_probs": log_probs[j].clone()}
                if self.critic is not None:
                    record["value"] = values[j].clone()
                if self.record_observations:  # kept on the host: a few hundred MB per iteration at 128 px
                    record.update(obs={k: v[picked[j]].clone() for k, v in host_obs.items()}, task_id=self.task_ids[i])
                self.records[i].append(record)
        return chunks.cpu().numpy()  # waits for the GPU

    def _graph_for(self, batch: int, inputs: dict) -> GraphedCall | None:
        if batch not in self.graphs:
            try:
                self.graphs[batch] = GraphedCall(self._infer, inputs, batch)
            except RuntimeError as e:  # an op that cannot be captured: stay correct, just slower
                log.warning("CUDA graph capture of the policy failed (%s); running it eagerly", e)
                self.cuda_graph = False
                return None
        return self.graphs[batch]


class GraphedCall:
    """``fn(**inputs)`` captured in a CUDA graph for a fixed batch size ``batch``.

    Calls with up to ``batch`` rows copy their inputs into static buffers (the other rows keep earlier,
    valid data), replay the graph and return views of its first rows — valid until the next call. The
    graph reads parameters in place, so in-place optimiser steps are seen; replacing parameter tensors is not.
    """

    def __init__(self, fn, inputs: dict, batch: int):
        def padded(x: torch.Tensor) -> torch.Tensor:
            reps = -(-batch // x.shape[0])
            return x.repeat(reps, *[1] * (x.dim() - 1))[:batch].clone()

        self.static = _map(padded, inputs)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside capture: cuDNN/cuBLAS choose their kernels here
            for _ in range(2):
                fn(**self.static)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = fn(**self.static)

    def __call__(self, inputs: dict):
        n = _first(inputs).shape[0]
        _map2(lambda dst, src: dst[:n].copy_(src), self.static, inputs)
        self.graph.replay()
        return tuple(o[:n] for o in self.outputs)


def _map(fn, tree):
    return {k: _map(fn, v) for k, v in tree.items()} if isinstance(tree, dict) else fn(tree)


def _map2(fn, dst, src):
    if isinstance(dst, dict):
        for k in dst:
            _map2(fn, dst[k], src[k])
    else:
        fn(dst, src)


def _first(tree):
    return _first(next(iter(tree.values()))) if isinstance(tree, dict) else tree
