"""Named seed spaces, in one place. Layout seeds of demonstrations, evaluation and RL never overlap, so no
evaluation episode starts from a layout a demonstration was collected on.

    demonstrations   seed * 100_000 + episode * 100 + retry          (< 10**9 for seeds < 10_000)
    evaluation       10**9 + seed * 10_000 + episode                 (LIBERO: packaged init state seed % 50)
    RL               3 * 10**9 + initial condition                   (LIBERO: packaged init state seed % 50)
    expert noise     (seed, crc32(task name), episode, retry)          of each demonstration
"""

from __future__ import annotations

import zlib

import numpy as np

DEMO_SEED_STRIDE = 100_000
EVAL_SEED_BASE = 10**9
RL_SEED_BASE = 3 * 10**9
RANK_SEED_STRIDE = 7919  # a prime, so (seed, rank) pairs do not collide for small seeds and ranks


def demo_layout_seed(seed: int, episode: int, retry: int) -> int:
    """Layout of demonstration ``episode`` of a collection (``retry``: the expert's attempts after a failure)."""
    return seed * DEMO_SEED_STRIDE + episode * 100 + retry


def demo_noise_rng(seed: int, task_name: str, episode: int, retry: int) -> np.random.Generator:
    """The expert-noise stream of that demonstration (per task too: tasks sharing a layout seed draw apart)."""
    return np.random.default_rng([seed, zlib.crc32(task_name.encode()), episode, retry])


def eval_layout_seed(seed: int, episode: int) -> int:
    return EVAL_SEED_BASE + seed * 10_000 + episode


def rl_layout_seed(initial_condition: int) -> int:
    return RL_SEED_BASE + initial_condition


def rank_seed(seed: int, rank: int) -> int:
    """The seed of one rank's sampling streams (policy sampling, initial conditions) under torchrun."""
    return seed * RANK_SEED_STRIDE + rank
