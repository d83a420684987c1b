"""The stateless prediction network and the joiner of a transducer (Ghodsi et al., 2020; icefall).

Decoder: each position sees only the last `context_size` tokens: an embedding (the blank's is fixed
at zero, so left padding is the same as blank context) and a grouped convolution over the context.

    tokens (B, S) -> (B, S, D): output s depends on tokens s - context_size + 1 .. s

Joiner: logits = out(tanh(encoder_proj(enc) + decoder_proj(dec))), split into the two projections
and `combine`, the form the pruned loss needs (it combines projections of pruned windows).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class StatelessDecoder(nn.Module):
    """forward(tokens (B, S) int64) -> (B, S, width)."""

    def __init__(self, vocab_size: int, width: int, context_size: int = 2, blank_id: int = 0) -> None:
        super().__init__()
        if context_size < 1:
            raise ValueError(f"context_size must be >= 1; got {context_size}")
        if width % 4:
            raise ValueError(f"width must be divisible by 4 (convolution groups of 4 channels); got {width}")
        self.context_size, self.blank_id = context_size, blank_id
        self.embedding = nn.Embedding(vocab_size, width, padding_idx=blank_id)
        self.conv = nn.Conv1d(width, width, context_size, groups=width // 4, bias=False) if context_size > 1 else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)
        if self.conv is not None:
            x = self.conv(F.pad(x.transpose(1, 2), (self.context_size - 1, 0))).transpose(1, 2)
        return F.relu(x)

    def last(self, contexts: torch.Tensor) -> torch.Tensor:
        """contexts (N, context_size) int64 -> (N, width): the output after each context's last
        token, forward(contexts)[:, -1], as a search needs it a step at a time: the grouped
        convolution at that one position as a batched product over the groups (for a few contexts,
        a convolution call's setup costs more than its arithmetic)."""
        if contexts.ndim != 2 or contexts.shape[1] != self.context_size:
            raise ValueError(f"contexts must be (N, {self.context_size}); got {tuple(contexts.shape)}")
        x = self.embedding(contexts)  # (N, C, width)
        if self.conv is None:
            return F.relu(x[:, -1])
        groups, (width, per_group, _) = self.conv.groups, self.conv.weight.shape
        x = x.transpose(1, 2).reshape(len(contexts), groups, per_group, self.context_size)  # (N, G, in, C)
        weight = self.conv.weight.view(groups, width // groups, per_group, self.context_size)  # (G, out, in, C)
        return F.relu(torch.einsum("ngic,goic->ngo", x, weight).reshape(len(contexts), width))


class Joiner(nn.Module):
    """forward(enc (..., E), dec (..., D)) -> logits (..., V), broadcasting enc against dec."""

    def __init__(self, encoder_dim: int, decoder_dim: int, joiner_dim: int, vocab_size: int) -> None:
        super().__init__()
        self.encoder_proj = nn.Linear(encoder_dim, joiner_dim)
        self.decoder_proj = nn.Linear(decoder_dim, joiner_dim)
        self.out = nn.Linear(joiner_dim, vocab_size)

    def combine(self, encoder_proj: torch.Tensor, decoder_proj: torch.Tensor) -> torch.Tensor:
        """Projections (..., J) broadcast against each other -> logits (..., V)."""
        return self.out(torch.tanh(encoder_proj + decoder_proj))

    def forward(self, enc: torch.Tensor, dec: torch.Tensor) -> torch.Tensor:
        return self.combine(self.encoder_proj(enc), self.decoder_proj(dec))
