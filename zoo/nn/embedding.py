"""Token (+ learned position + token type) embeddings, then optional LayerNorm and dropout.

The embedding lookups save only their indices; the norm saves its output and rstd (see
`zoo.nn.norm`); the dropout saves a seed. State-dict names follow BERT's layout:
word.weight, position.weight, token_type.weight, norm.weight, norm.bias.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.nn.dropout import check_probability, dropout
from zoo.nn.norm import Norm


class Embeddings(nn.Module):
    """input_ids (B, S) [+ position_ids (B|1, S), token_type_ids (B, S)] -> (B, S, W).

    positions: size of the learned position table (0: none); token_types: size of the token-type
    table (0: none); norm: LayerNorm after the sum (BERT) or none (GPT); dropout after it."""

    def __init__(self, vocab_size: int, width: int, *, positions: int = 0, token_types: int = 0, norm: bool = False,
                 eps: float = 1e-12, dropout: float = 0.0) -> None:
        super().__init__()
        check_probability("dropout", dropout)
        self.dropout = dropout
        self.word = nn.Embedding(vocab_size, width)
        self.position = nn.Embedding(positions, width) if positions else None
        self.token_type = nn.Embedding(token_types, width) if token_types else None
        self.norm = Norm(width, "layer", eps) if norm else None

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids: (B, S) int; position_ids default to 0..S-1; token_type_ids default to 0."""
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must be (B, S); got {tuple(input_ids.shape)}")
        x = self.word(input_ids)
        if self.position is not None:
            length, table = input_ids.shape[1], self.position.num_embeddings
            if position_ids is None:
                if length > table:
                    raise ValueError(f"sequence length {length} exceeds the {table} learned positions")
                position_ids = torch.arange(length, device=input_ids.device)[None]
            x = x + self.position(position_ids)
        if self.token_type is not None:
            x = x + self.token_type(torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids)
        if self.norm is not None:
            x = self.norm(x)
        return dropout(x, self.dropout, self.training)
