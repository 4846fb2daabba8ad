"""``rl.overlap``: the next iteration's rollouts run while this iteration trains (``placement.mode=disaggregated``).

Before an iteration's update starts, the rollout actor gets the weights the update has not touched yet, and a
thread of the trainer drives the next iteration's rollouts with them (the actor steps and acts; the thread only
waits and draws initial conditions) while the update runs. The next iteration therefore trains on episodes
sampled one update earlier; PPO's ratio is taken against the log-probs recorded while sampling, so it is the
importance ratio to the policy that sampled them.

A checkpoint written while rollouts run ahead holds what redoes them on resume: the sampler's and the policy's
random streams as they were before those rollouts began, and the weights they were sampled with
(``rollout_weights.safetensors``). A resumed run sends those weights, draws the same episodes and goes on as the
uninterrupted run did.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from ript.errors import RiptError
from ript.model_loader import check_and_load
from ript.utils.checkpoint import host_state

ROLLOUT_WEIGHTS_FILE = "rollout_weights.safetensors"


def check_overlap(cfg) -> None:
    """The settings overlap works under, checked before anything starts."""
    if not cfg.rl.get("overlap"):
        return
    from ript.rl.placement import rolls_out_remotely

    if not rolls_out_remotely(cfg):
        raise RiptError("rl.overlap=true needs placement.mode=disaggregated or hybrid (rollouts in an actor of their "
                        "own, so that they run while this process trains)")
    if cfg.rl.recompute_old_log_probs:
        raise RiptError("rl.overlap=true takes PPO's ratio against the log-probs recorded while sampling; "
                        "rl.recompute_old_log_probs=true would rescore them with a newer policy")


class RolloutsAhead:
    """The next iteration's rollouts in a thread; ``start`` snapshots what a checkpoint needs to redo them."""

    def __init__(self, collect: Callable[[int], Any], streams: Callable[[], dict], modules: torch.nn.Module,
                 send: Callable[[torch.nn.Module], None]):
        self.collect, self.streams, self.modules, self.send = collect, streams, modules, send
        self.thread: threading.Thread | None = None
        self.result: Any = None
        self.error: BaseException | None = None
        self.saved: tuple[dict, dict[str, torch.Tensor]] | None = None  # (streams, weights) before the rollouts

    def start(self, iteration: int) -> None:
        # copies: on the CPU ``host_state`` holds the live tensors, which the update is about to change
        self.saved = (self.streams(), {k: v.clone() for k, v in host_state(self.modules).items()})
        self.send(self.modules)  # here, not in the thread: the update about to start changes these tensors
        self.result, self.error = None, None
        self.thread = threading.Thread(target=self._collect, args=(iteration,), name="rollouts-ahead", daemon=True)
        self.thread.start()

    def _collect(self, iteration: int) -> None:
        try:
            self.result = self.collect(iteration)
        except BaseException as e:  # noqa: BLE001  (raised again in the trainer's thread)
            self.error = e

    def wait(self) -> Any:
        """The rollouts started ahead (their error, raised here)."""
        self.thread.join()
        self.thread = None
        if self.error is not None:
            raise self.error
        return self.result

    def write(self, folder: Path) -> None:
        """The weights the rollouts ahead were sampled with, beside the checkpoint's own."""
        save_file(self.saved[1], str(Path(folder) / ROLLOUT_WEIGHTS_FILE))


def rollout_weights(ckpt: Path, modules: torch.nn.Module) -> torch.nn.Module | None:
    """A copy of ``modules`` holding the weights a checkpoint's rollouts ahead were sampled with (None: it has
    none, written without overlap or by the last iteration)."""
    path = Path(ckpt) / ROLLOUT_WEIGHTS_FILE
    if not path.is_file():
        return None
    held = copy.deepcopy(modules)
    check_and_load(held, load_file(str(path)), str(path))
    return held
