"""Value heads (a learned critic for ``advantage=gae``) and the critic's loss.

A value head reads what the policy computed for a decision — a chunk policy's context tokens, a VLA's hidden
states — and predicts the decision's discounted return. It is its own module (``critic.safetensors`` in every
RL checkpoint), trained with its own parameter group and learning rate.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from ript.errors import RiptError
from ript.model_loader import check_and_load
from ript.utils.checkpoint import host_state, load_weights

CRITIC_FILE = "critic.safetensors"


class ContextValueHead(nn.Module):
    """V(s) from a chunk policy's context tokens (B, L, D): their mean, then a two-layer MLP. The last layer
    starts at zero, so a fresh critic predicts 0 and the first advantages are the returns themselves."""

    def __init__(self, dim: int, hidden: int, detach_input: bool = True):
        super().__init__()
        self.detach_input = detach_input  # then the value loss leaves the encoders and context alone
        self.mlp = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, hidden),
                                 nn.GELU(), nn.Linear(hidden, 1))
        nn.init.zeros_(self.mlp[-1].weight)
        nn.init.zeros_(self.mlp[-1].bias)

    def forward(self, context: torch.Tensor) -> torch.Tensor:
        x = context.detach() if self.detach_input else context
        with torch.autocast(x.device.type, enabled=False):  # fp32 alike when sampling and when training
            return self.mlp(x.float().mean(1)).squeeze(-1)


CRITIC_POSITIONS = ("expert", "vlm")


class FlowValueHead(ContextValueHead):
    """A flow policy's critic at one of πRL's two places: after the action expert (``expert``: its hidden states
    averaged over the chunk and the denoise steps) or after the prefix (``vlm``: the prefix tokens' mean)."""

    def __init__(self, dim: int, hidden: int, detach_input: bool = True, position: str = "expert"):
        if position not in CRITIC_POSITIONS:
            raise RiptError(f"critic position {position!r}; choose one of {', '.join(CRITIC_POSITIONS)}")
        super().__init__(dim, hidden, detach_input)
        self.position = position

    def forward(self, prefix: torch.Tensor, expert_hidden: torch.Tensor | None = None) -> torch.Tensor:
        return super().forward(prefix if self.position == "vlm" else expert_hidden)


class AttentionPoolValueHead(nn.Module):
    """V(s) from a VLA's hidden states (B, L, D) with a padding mask (B, L): one learned query attends over
    the states, then an MLP (the pooling of the OpenVLA-OFT actor-critic)."""

    def __init__(self, dim: int, hidden: int, heads: int = 8, detach_input: bool = True):
        super().__init__()
        self.detach_input = detach_input
        heads = heads if dim % heads == 0 else 1
        self.query = nn.Parameter(torch.randn(1, 1, dim) * dim ** -0.5)
        self.norm = nn.LayerNorm(dim)
        self.attend = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, 1))
        nn.init.zeros_(self.mlp[-1].weight)
        nn.init.zeros_(self.mlp[-1].bias)

    def forward(self, states: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        with torch.autocast(states.device.type, enabled=False):
            x = self.norm((states.detach() if self.detach_input else states).float())
            pooled, _ = self.attend(self.query.expand(len(x), -1, -1), x, x,
                                    key_padding_mask=None if mask is None else ~mask.bool())
            return self.mlp(pooled[:, 0]).squeeze(-1)


def value_loss(new: torch.Tensor, old: torch.Tensor, returns: torch.Tensor, clip: float | None, kind: str,
               delta: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The critic's regression to the returns; with ``clip``, the worse of the new value and the new value
    kept within ``clip`` of the one recorded at sampling time (PPO's value clipping)."""

    def err(v: torch.Tensor) -> torch.Tensor:
        if kind == "huber":
            return F.huber_loss(v, returns, delta=delta, reduction="none")
        return 0.5 * (v - returns) ** 2

    loss = err(new)
    clipped_share = new.new_zeros(())
    if clip is not None:
        clipped = old + (new - old).clamp(-clip, clip)
        loss = torch.maximum(loss, err(clipped))
        clipped_share = ((new - old).abs() > clip).float().mean().detach()
    return loss.mean(), {"value_clip_fraction": clipped_share}


def explained_variance(predicted: torch.Tensor, returns: torch.Tensor) -> float:
    """1 - Var(returns - predicted) / Var(returns): 1 a perfect critic, 0 no better than the mean, NaN when the
    returns do not vary."""
    var = returns.float().var(unbiased=False)
    if var <= 0:
        return float("nan")
    return float(1 - (returns.float() - predicted.float()).var(unbiased=False) / var)


def write_learner_files(learner, folder: Path, whole: dict | None = None) -> None:
    """What an RL checkpoint holds beside the weights: the learner's own files (from ``whole``, the weights
    gathered whole, where the model is sharded) and the critic."""
    learner.write_extra(folder, whole)
    if learner.critic is not None:
        save_file(host_state(learner.critic), str(folder / CRITIC_FILE))


def load_critic(critic: nn.Module, ckpt_dir: Path) -> None:
    """The critic of a resumed run; a checkpoint without one (saved by an rloo/grpo run) is refused."""
    path = Path(ckpt_dir) / CRITIC_FILE
    if not path.is_file():
        raise RiptError(f"{path}: missing; this checkpoint was saved without a critic (resume it with the "
                        f"rl.advantage it was trained with)")
    check_and_load(critic, load_weights(ckpt_dir, CRITIC_FILE), str(path))
