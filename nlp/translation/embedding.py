"""`TranslatorEmbeddings`: the one token embedding a translator's source, target and output head
share, scaled, plus sinusoidal or learned positions, then dropout.

One module embeds both sequences, so that a plan names it once: under sequence parallelism its
output is what splits along the sequence, and under tensor parallelism its table splits by
vocabulary rows.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from nlp.translation.config import TranslatorConfig
from zoo.nn import dropout


def sinusoidal_positions(positions: int, width: int) -> torch.Tensor:
    """(positions, width) float32: position t's sin(t / 10000^(2i / width)) in column i of the
    first half and its cos in column i of the second (Marian's and fairseq's layout; an odd width
    gives the sines one column more)."""
    half = (width + 1) // 2
    frequencies = 10000.0 ** (-2 * torch.arange(half, dtype=torch.float64) / width)
    angles = torch.arange(positions, dtype=torch.float64)[:, None] * frequencies
    return torch.cat([angles.sin(), angles[:, : width // 2].cos()], dim=1).float()


class TranslatorEmbeddings(nn.Module):
    """`word` (vocab_size x width; the padding row starts at zero) and `position` (a learned
    max_positions x width table, or the sinusoidal one as a buffer that is not stored).
    forward(ids (B, S), start, zero_start) -> (B, S, W): ids at positions start..start + S - 1,
    their token embeddings times sqrt(width) (`scale_embedding`) plus positions, dropout;
    zero_start: position 0's token embedding is zeros (Marian's decoder)."""

    def __init__(self, config: TranslatorConfig) -> None:
        super().__init__()
        self.config = config
        # No padding_idx: a vocabulary-parallel split refuses it, and nothing trains the padding row
        # anyway (padded positions reach no loss; init_weights zeroes it).
        self.word = nn.Embedding(config.vocab_size, config.width)
        if config.positions == "learned":
            self.position = nn.Embedding(config.max_positions, config.width)
        else:
            self.register_buffer("position", sinusoidal_positions(config.max_positions, config.width), persistent=False)

    def forward(self, ids: torch.Tensor, start: int = 0, zero_start: bool = False) -> torch.Tensor:
        config, length = self.config, ids.shape[1]
        if start + length > config.max_positions:
            raise ValueError(f"sequence of {start + length} positions exceeds max_positions={config.max_positions}")
        x = self.word(ids) * (math.sqrt(config.width) if config.scale_embedding else 1.0)
        if zero_start and start == 0:
            x = torch.cat([torch.zeros_like(x[:, :1]), x[:, 1:]], dim=1)
        table = self.position.weight if isinstance(self.position, nn.Embedding) else self.position
        x = x + table[start:start + length].to(x.dtype)
        return dropout(x, config.dropout, self.training)
