"""Stage 1: QueST's autoregressive prior over skill tokens, conditioned on the task and observations.

The sequence is ``[task, obs tokens (frame by frame: cameras, low-dim), <start>, s_1 .. s_{T-1}]`` and the
model predicts ``s_1 .. s_T`` from the last T positions. The stage-0 autoencoder lives inside this model
(frozen by default), so a stage-1 checkpoint alone decodes actions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ript.errors import RiptError
from ript.models.action_autoencoder import ActionAutoencoder
from ript.models.conditioning import ObservationConditioned
from ript.models.transformer import Transformer
from ript.registry import MODELS


def processed_log_probs(logits: torch.Tensor, temperature: float, top_k: int | None) -> torch.Tensor:
    """Log-probs of the distribution actually sampled from: temperature, then top-k renormalised.

    Sampling and scoring both go through here, so RL's ratio compares like with like.
    """
    if temperature <= 0:
        raise RiptError("temperature must be > 0 for sampling; use greedy=True for argmax decoding")
    logits = logits.float() / temperature
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return F.log_softmax(logits, dim=-1)


@MODELS.register("skill_prior")
class SkillPrior(ObservationConditioned):
    stage = "stage1"

    def __init__(
        self,
        autoencoder: dict,
        task_names: list[str],
        image_keys: list[str],
        lowdim_dims: dict[str, int],
        lang_dim: int | None = 384,
        frame_stack: int = 1,
        dim: int = 256,
        n_layer: int = 6,
        n_head: int = 8,
        dropout: float = 0.1,
        encoder_width: int = 64,
        num_kp: int = 32,
        encoder_stages: int = 4,
    ):
        super().__init__()
        self.autoencoder = ActionAutoencoder(**autoencoder)
        self.init_conditioning(task_names, image_keys, lowdim_dims, lang_dim, frame_stack, dim, encoder_width, num_kp,
                               encoder_stages)
        self.vocab_size = self.autoencoder.codebook_size
        self.num_tokens = self.autoencoder.num_tokens
        self.start_token = self.vocab_size
        self.prefix_len = self.observation_tokens
        self.tok_emb = nn.Embedding(self.vocab_size + 1, dim)
        self.pos_emb = nn.Parameter(torch.randn(1, self.prefix_len + self.num_tokens, dim) * 0.02)
        self.drop = nn.Dropout(dropout)
        self.gpt = Transformer(dim, n_layer, n_head, dropout, causal=True)
        self.head = nn.Linear(dim, self.vocab_size)
        self.autoencoder.requires_grad_(False)
        self.autoencoder.eval()

    def train(self, mode: bool = True) -> SkillPrior:
        """The autoencoder stays in eval mode: its encoder makes the prior's target tokens, and with dropout
        on, those targets would be noisy after any switch back to training (e.g. after a validation pass)."""
        super().train(mode)
        self.autoencoder.eval()
        return self

    def context(self, obs: dict[str, torch.Tensor], task_ids: torch.Tensor) -> torch.Tensor:
        """Obs tensors (B, frame_stack, ...) and task ids (B,) -> context tokens (B, prefix_len, dim)."""
        return self.observation_context(obs, task_ids)

    def _embed_tokens(self, tokens: torch.Tensor, offset: int) -> torch.Tensor:
        n = tokens.shape[1]
        return self.tok_emb(tokens) + self.pos_emb[:, self.prefix_len + offset : self.prefix_len + offset + n]

    def logits(self, context: torch.Tensor, tokens_in: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits for each position of ``tokens_in`` (which starts with <start>)."""
        x = torch.cat([context + self.pos_emb[:, : self.prefix_len], self._embed_tokens(tokens_in, 0)], dim=1)
        h, _ = self.gpt(self.drop(x))
        return self.head(h[:, self.prefix_len :])

    # ----------------------------------------------------------------- training
    @torch.no_grad()
    def target_tokens(self, actions_norm: torch.Tensor) -> torch.Tensor:
        return self.autoencoder.encode(actions_norm)[1]

    def tokens_in(self, targets: torch.Tensor) -> torch.Tensor:
        start = torch.full_like(targets[:, :1], self.start_token)
        return torch.cat([start, targets[:, :-1]], dim=1)

    def loss(self, obs: dict[str, torch.Tensor], task_ids: torch.Tensor, actions: torch.Tensor) -> dict:
        """Cross-entropy of the autoencoder's tokens for (B, chunk, A) raw actions."""
        targets = self.target_tokens(self.autoencoder.action_normalizer.normalize(actions))
        logits = self.logits(self.context(obs, task_ids), self.tokens_in(targets))
        ce = F.cross_entropy(logits.reshape(-1, self.vocab_size).float(), targets.reshape(-1))
        acc = (logits.argmax(-1) == targets).float().mean()
        return {"loss": ce, "ce": ce, "token_acc": acc, "targets": targets}

    # ----------------------------------------------------------------- sampling
    @torch.no_grad()
    def sample(
        self,
        context: torch.Tensor,
        temperature: float = 1.0,
        top_k: int | None = None,
        greedy: bool = False,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
        noise: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample T tokens. Returns indices (B, T) and their log-probs under the sampled distribution.

        Sampling is Gumbel-max on ``noise`` (B, T, vocab) uniforms in (0, 1), drawn here from ``generator``
        unless given: exact samples of the processed softmax, and no host synchronisation, so the whole
        call can be captured in a CUDA graph with the noise as an input.
        """
        b = context.shape[0]
        if noise is None and not greedy:
            noise = self.sampling_noise(b, context.device, generator)
        tokens = torch.full((b, 1), self.start_token, dtype=torch.long, device=context.device)
        prefix = context + self.pos_emb[:, : self.prefix_len]
        cache = None
        out_idx, out_lp = [], []
        for t in range(self.num_tokens):
            if use_cache:
                x = torch.cat([prefix, self._embed_tokens(tokens, 0)], 1) if t == 0 else self._embed_tokens(
                    tokens[:, -1:], t)
                h, cache = self.gpt(x, cache)
            else:
                h, _ = self.gpt(torch.cat([prefix, self._embed_tokens(tokens, 0)], 1))
            logits = self.head(h[:, -1])
            if greedy:
                lp = F.log_softmax(logits.float(), -1)
                nxt = lp.argmax(-1)
            else:
                lp = processed_log_probs(logits, temperature, top_k)
                gumbel = -torch.log(-torch.log(noise[:, t].float()))
                nxt = (lp + gumbel).argmax(-1)  # -inf (outside top-k) never wins
            out_idx.append(nxt)
            out_lp.append(lp.gather(-1, nxt[:, None]).squeeze(-1))
            tokens = torch.cat([tokens, nxt[:, None]], dim=1)
        return torch.stack(out_idx, 1), torch.stack(out_lp, 1)

    def sampling_noise(self, batch: int, device, generator: torch.Generator | None = None) -> torch.Tensor:
        """Uniforms in the open interval (0, 1) for ``sample``'s Gumbel-max draws."""
        u = torch.rand((batch, self.num_tokens, self.vocab_size), device=device, generator=generator)
        return u.clamp_(torch.finfo(u.dtype).tiny, 1.0 - torch.finfo(u.dtype).eps)

    @torch.no_grad()
    def predict_actions(self, obs: dict[str, torch.Tensor], task_ids: torch.Tensor, **sample_kwargs) -> torch.Tensor:
        """Raw (un-normalised) action chunks (B, chunk, A)."""
        idx, _ = self.sample(self.context(obs, task_ids), **sample_kwargs)
        ae = self.autoencoder
        return ae.action_normalizer.unnormalize(ae.decode_indices(idx).float())
