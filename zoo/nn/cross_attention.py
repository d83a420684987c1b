"""`CrossAttention`: a decoder's attention over an encoder's output (the memory).

The keys and values depend on the memory alone, so they are projected once per source sentence:
`memory_kv(memory)` gives them, and a decoding loop passes them to every step (`kv=`) instead of
projecting the memory again; a training forward projects them in the call.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.nn.attention import attention
from zoo.nn.dropout import check_probability


class CrossAttention(nn.Module):
    """Multi-head attention of queries from x over keys and values from the memory: q, k, v, out
    projections (state-dict names q.*, k.*, v.*, out.*). forward(x (B, S, W), memory (B, Sm, W) or
    kv=(k, v), memory_padding_mask (B, Sm) bool, True for real positions) -> (B, S, W)."""

    def __init__(self, width: int, heads: int, *, bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        if heads < 1 or width % heads:
            raise ValueError(f"heads ({heads}) must divide width ({width})")
        check_probability("dropout", dropout)
        self.heads, self.head_dim, self.dropout = heads, width // heads, dropout
        self.q = nn.Linear(width, width, bias=bias)
        self.k = nn.Linear(width, width, bias=bias)
        self.v = nn.Linear(width, width, bias=bias)
        self.out = nn.Linear(width, width, bias=bias)

    def _heads(self, y: torch.Tensor) -> torch.Tensor:
        return y.unflatten(-1, (-1, self.head_dim)).transpose(1, 2)

    def memory_kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values of `memory` (B, Sm, W): each (B, H, Sm, D)."""
        return self._heads(self.k(memory)), self._heads(self.v(memory))

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None,
                memory_padding_mask: torch.Tensor | None = None,
                kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        if (memory is None) == (kv is None):
            raise ValueError("CrossAttention takes the memory or its keys and values (kv=memory_kv(memory)), one "
                             f"of them; got memory={'a tensor' if memory is not None else None}, "
                             f"kv={'a pair' if kv is not None else None}")
        k, v = self.memory_kv(memory) if kv is None else kv
        y = attention(self._heads(self.q(x)), k, v, key_padding_mask=memory_padding_mask, dropout_p=self.dropout,
                      training=self.training)
        return self.out(y.transpose(1, 2).flatten(2))

    def extra_repr(self) -> str:
        return f"heads={self.heads}, dropout={self.dropout}"
