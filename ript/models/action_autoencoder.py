"""Stage 0: QueST's action autoencoder. Causal conv + causal transformer encoder, FSQ or VQ bottleneck
(vector-quantize-pytorch), transformer decoder that reads the whole chunk back from its tokens."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ript.data.normalize import Normalizer
from ript.errors import RiptError
from ript.models.transformer import Transformer
from ript.registry import MODELS


class CausalConv1d(nn.Conv1d):
    """Pads on the left only, so token i never sees actions after its own window."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, (self.kernel_size[0] - 1, 0)))


@MODELS.register("action_autoencoder")
class ActionAutoencoder(nn.Module):
    stage = "stage0"

    def __init__(
        self,
        action_dim: int,
        chunk_size: int = 32,
        downsample: int = 4,
        dim: int = 256,
        n_head: int = 4,
        enc_layers: int = 2,
        dec_layers: int = 4,
        kernel_size: int = 5,
        quantizer: str = "fsq",
        fsq_levels: tuple[int, ...] = (8, 5, 5, 5),
        vq_codebook_size: int = 1024,
        vq_dim: int = 64,
        dropout: float = 0.1,
    ):
        super().__init__()
        if downsample < 1 or downsample & (downsample - 1) or chunk_size % downsample:
            raise RiptError(f"algo.downsample={downsample} must be a power of two dividing chunk_size={chunk_size}")
        self.action_dim = action_dim
        self.chunk_size = chunk_size
        self.num_tokens = chunk_size // downsample
        self.action_normalizer = Normalizer(action_dim, "minmax")
        self.in_proj = nn.Linear(action_dim, dim)
        convs = []
        for _ in range(int(math.log2(downsample))):
            convs += [CausalConv1d(dim, dim, kernel_size, stride=2), nn.GELU()]
        self.conv = nn.Sequential(*convs)
        self.enc_pos = nn.Parameter(torch.randn(1, self.num_tokens, dim) * 0.02)
        self.encoder = Transformer(dim, enc_layers, n_head, dropout, causal=True)
        if quantizer == "fsq":
            from vector_quantize_pytorch import FSQ

            code_dim = len(fsq_levels)
            self.quantizer = FSQ(list(fsq_levels))
            self.codebook_size = math.prod(fsq_levels)
        elif quantizer == "vq":
            from vector_quantize_pytorch import VectorQuantize

            code_dim = vq_dim
            self.quantizer = VectorQuantize(dim=vq_dim, codebook_size=vq_codebook_size, decay=0.99,
                                            commitment_weight=0.25, kmeans_init=False)
            self.codebook_size = vq_codebook_size
        else:
            raise RiptError(f"algo.quantizer={quantizer!r}: expected 'fsq' or 'vq'")
        self.quantizer_kind = quantizer
        self.to_code = nn.Linear(dim, code_dim)
        self.from_code = nn.Linear(code_dim, dim)
        self.dec_queries = nn.Parameter(torch.randn(1, chunk_size, dim) * 0.02)
        self.dec_mem_pos = nn.Parameter(torch.randn(1, self.num_tokens, dim) * 0.02)
        layer = nn.TransformerDecoderLayer(dim, n_head, 4 * dim, dropout, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.decoder = nn.TransformerDecoder(layer, dec_layers, norm=nn.LayerNorm(dim))
        self.out = nn.Linear(dim, action_dim)

    def latents(self, actions_norm: torch.Tensor) -> torch.Tensor:
        """(B, chunk, A) normalised actions -> continuous latents (B, T, d) before quantisation."""
        x = self.conv(self.in_proj(actions_norm).transpose(1, 2)).transpose(1, 2)
        x, _ = self.encoder(x + self.enc_pos)
        return self.to_code(x)

    def encode(self, actions_norm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, chunk, A) normalised actions -> quantised codes (B, T, d), indices (B, T), aux loss."""
        z = self.latents(actions_norm)
        if self.quantizer_kind == "fsq":
            codes, indices = self.quantizer(z)
            aux = z.new_zeros(())
        else:
            codes, indices, aux = self.quantizer(z)
        return codes, indices.long(), aux

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        mem = self.from_code(codes) + self.dec_mem_pos
        q = self.dec_queries.expand(codes.shape[0], -1, -1)
        return self.out(self.decoder(q, mem))

    def indices_to_codes(self, indices: torch.Tensor) -> torch.Tensor:
        if self.quantizer_kind == "fsq":
            return self.quantizer.indices_to_codes(indices)
        return self.quantizer.get_codes_from_indices(indices)

    def decode_indices(self, indices: torch.Tensor) -> torch.Tensor:
        """Token indices (B, T) -> normalised actions (B, chunk, A)."""
        return self.decode_codes(self.indices_to_codes(indices))

    def forward(self, actions_norm: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        codes, indices, aux = self.encode(actions_norm)
        recon = self.decode_codes(codes)
        err = (recon - actions_norm).abs()
        if mask is not None:
            m = mask.unsqueeze(-1).to(err.dtype)
            l1 = (err * m).sum() / (m.sum() * err.shape[-1]).clamp(min=1.0)
        else:
            l1 = err.mean()
        return {"loss": l1 + aux, "l1": l1, "indices": indices, "recon": recon}
