"""What the policies over ript's own models share: each env's task, its frame stack batched into the model's
inputs, a batch layout in which a row's result does not depend on the other rows, and each decision replayed as
one CUDA graph per padded batch size (eagerly a decision is hundreds to thousands of small kernel launches)."""

from __future__ import annotations

import numpy as np
import torch

from ript.policies.base import ChunkingPolicy
from ript.policies.frame_stacks import FrameStacks
from ript.utils.logging import log


class ObservationPolicy(ChunkingPolicy):
    """A chunking policy on a model with ``task_index`` and observation keys; subclasses fill in ``plan`` and
    ``_infer`` (one batched decision, no host synchronisation inside, so that it can be captured)."""

    def __init__(self, model, action_dim: int, action_horizon: int, device, seed: int, cuda_graph: bool,
                 frame_stack: int | None = None, obs_keys: list[str] | None = None):
        self.model = model
        super().__init__(action_dim, action_horizon, frame_stack or model.frame_stack, device, seed,
                         obs_keys=obs_keys or model.image_keys + model.lowdim_keys)
        self.cuda_graph = cuda_graph and self.device.type == "cuda"
        self.graphs: dict[int, GraphedCall] = {}

    def set_deterministic(self, on: bool) -> None:
        super().set_deterministic(on)
        self.graphs = {}  # a captured decision has the choice baked in

    def reset(self, n_envs: int, block: int | None = None) -> None:
        super().reset(n_envs, block)
        self.task_ids = [0] * n_envs
        self.stacks = FrameStacks(n_envs, self.frame_stack, pin=self.device.type == "cuda")

    def reset_env(self, i: int, task_name: str, episode_key: int) -> None:
        super().reset_env(i, task_name, episode_key)
        self.stacks.begin(i)

    def start_task(self, i: int, task_name: str) -> None:
        self.task_ids[i] = self.model.task_index(task_name)

    def observe(self, i: int, obs: dict[str, np.ndarray]) -> None:
        # the frame stacks are rows of arrays here (FrameStacks), not the base class's per-env lists
        self.stacks.put(i, {k: obs[k] for k in self.obs_keys})

    def _inputs(self, rows: list[int]) -> tuple[dict, dict]:
        """(host observations, device inputs) of these rows' frame stacks and tasks. The host arrays may be the
        frame stacks themselves: plan() waits for the device before the next observation overwrites them."""
        # the fixed layout reads its block's frames in env order: a slice of the arrays, no gather
        host_obs = self.stacks.batch(self._block_rows(rows[0]))
        return host_obs, {"obs": {k: v.to(self.device, non_blocking=True) for k, v in host_obs.items()},
                          "task_ids": torch.tensor([self.task_ids[i] for i in rows], device=self.device)}

    def recorded_frames(self, host_obs: dict, picked: list[int], envs: list[int]) -> list[dict] | None:
        """When decisions record their observations (an update that re-encodes them): for each of ``envs`` its
        frames and task, rows of one host copy of the picked frames (the frame stacks' rows are reused); frames
        stay on the host, a few hundred MB per iteration at 128 px. None otherwise."""
        if not self.record_observations:
            return None
        frames = {k: v[picked] for k, v in host_obs.items()}
        return [{"obs": {k: v[j] for k, v in frames.items()}, "task_id": self.task_ids[i]} for j, i in enumerate(envs)]

    @property
    def fixed_layout(self) -> bool:
        # every decision a block-sized batch, so that an episode's actions do not depend on which envs happened
        # to be planned with it (on a CPU a 1-row batch alone moves the last bits, and an episode then diverges)
        return True

    def _block_rows(self, env: int) -> list[int]:
        """The envs of ``env``'s block, padded to the block's size with the block's first (the last block of a
        run may be short)."""
        first = env - env % self.block
        rows = list(range(first, min(first + self.block, self.stacks.n_envs)))
        return rows + [first] * (self.block - len(rows))

    def _layout(self, envs: list[int]) -> tuple[list[int], list[int]]:
        """(the env each batch row reads, the rows holding ``envs``' results). The envs of one block (``reset``'s)
        are planned together and env i always sits in row i % block of a block-sized batch (the other rows read
        their env's last frames, whatever they are, and ``envs[0]``'s task and noise): a row's result then does
        not depend on which envs were planned with it, which the batch's shape and an env's row otherwise move in
        the last bits (RL's ratio uses the recorded log-probs as they are; resume and evaluation must match)."""
        rows = self._block_rows(envs[0])
        if any(i not in rows for i in envs):
            raise ValueError(f"envs {envs} span more than one block of {self.block}")
        planned = set(envs)
        return [i if i in planned else envs[0] for i in rows], [rows.index(i) for i in envs]

    def _decide(self, inputs: dict):
        """``_infer(**inputs)``, replayed from a CUDA graph where one can be captured."""
        graphed = self._graph_for(self.block, inputs) if self.cuda_graph and not self.model.training else None
        return graphed(inputs) if graphed is not None else self._infer(**inputs)

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
