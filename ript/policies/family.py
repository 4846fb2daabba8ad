"""The policy-family contract: what ``ript rl`` and ``ript eval`` ask of a family, written down once.

A family (the skill prior's chunk policy, OpenVLA-OFT, the original OpenVLA, ...) is registered by the name of
the model it runs in ``ript.registry.POLICIES``. It loads its model from a checkpoint and builds its policy on it
(``load``, before a run folder exists, so that bad inputs leave nothing behind), builds the RL learner that trains
it (``learner``), names what RL's checkpoints record (``rl_checkpoint``), evaluates it between RL iterations
(``rl_evaluation``) and says where an evaluation's results go (``eval_output``). The RL and evaluation stages are
written once against this protocol; ``ript.policies.families`` picks the family a checkpoint holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from ript.policies.base import ChunkingPolicy


@dataclass
class Loaded:
    """A family's model and policy, and what the stages need from the checkpoint they came from."""
    model: torch.nn.Module
    policy: ChunkingPolicy   # RL: sampling (and recording once a learner attaches); eval: the family's eval mode
    task_names: list[str]
    metadata: dict           # what runners are built from (suite, env args); RL checkpoints record it
    results: dict            # what an evaluation's results.json records about the policy
    source: dict[str, Any] = field(default_factory=dict)  # the family's own record of the checkpoint


class PolicyFamily(Protocol):
    configs: tuple[str, ...]  # the ``policy`` config group entries whose keys the family reads

    def load(self, cfg, device: str, seed: int, rl: bool) -> Loaded: ...

    def learner(self, loaded: Loaded, cfg, device: str, critic_cfg) -> Any: ...  # a ript.rl.learners.Learner

    def rl_checkpoint(self, loaded: Loaded, cfg) -> dict: ...  # config.json of every RL checkpoint

    def rl_evaluation(self, loaded: Loaded, learner, cfg, device: str, runner, run_dir: Path,
                      ) -> Callable[[int, Any], None]: ...  # evaluate(iteration, logger) on rank 0's runner

    def eval_output(self, loaded: Loaded, cfg) -> tuple[Path, str]: ...  # (results folder, the plots' title)
