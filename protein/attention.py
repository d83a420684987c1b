"""AlphaFold's gated multi-head attention with additive biases, through SDPA in float32.

    x (..., L, C) -> q, k, v (..., H, L, c) -> softmax(q k^T / sqrt(c) + bias) v
    -> gate sigmoid(Linear(x)) -> Linear -> (..., L, C)

`bias` broadcasts against (..., H, L, L): a pair bias (B, 1, H, L, L) for MSA row attention, a
mask bias (..., 1, 1, L) for padded keys. The logits and softmax run in float32 (protein.precision).

SDPA's fused kernels (flash attention on CPU, memory-efficient attention on GPU) take q, k, v of
four dimensions (N, H, L, c) only; with more, SDPA falls back to its math path, which materialises
the logits and the softmax. The Evoformer's attentions have five ((B, rows, H, L, c)), so their
leading dimensions are merged into N first, and a pair bias with every key present goes in
broadcast along the rows (`with_key_mask`) rather than materialised: folding 256 residues with
fold-tiny on 2 cores went from 19.3 s and 1,416 MiB peak RSS to 5.6 s and 500 MiB (BENCHMARKS.md,
"Evoformer attention through SDPA's fused kernel").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from protein.precision import float32_island

MASK_LOGIT = -1e9
"""Added to the logits of masked keys."""


def mask_bias(mask: torch.Tensor) -> torch.Tensor:
    """(..., L) bool or 0/1 key mask -> (..., 1, 1, L) float bias: 0 where present, MASK_LOGIT where not."""
    return ((1.0 - mask.float()) * MASK_LOGIT)[..., None, None, :]


def with_key_mask(bias: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """bias (..., H, L, L) + mask_bias(mask (..., L)), or bias as it is when every key is present
    (one whole chain, as folding gives): a pair bias (B, 1, H, L, L) then reaches SDPA broadcast
    along the rows (stride 0) instead of materialised (B, rows, H, L, L)."""
    return bias if bool(mask.all()) else bias + mask_bias(mask)


@float32_island
def biased_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(c) + bias) v in float32: q, k, v (..., H, L, c); bias broadcast to (..., H, L, L).
    The leading dimensions are merged into one for SDPA's fused kernels (module docstring); the bias
    keeps its own head and query dimensions, so a (..., 1, 1, L) mask broadcasts there still. (On CPU
    a bias that requires a gradient still takes the math path: the flash kernel has no bias gradient.)"""
    lead = q.shape[:-3]
    if len(lead) <= 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    bias = bias.reshape((1,) * (q.ndim - bias.ndim) + tuple(bias.shape))
    bias = bias.expand(*lead, *bias.shape[-3:]).reshape(-1, *bias.shape[-3:])
    out = F.scaled_dot_product_attention(*(t.reshape(-1, *t.shape[-3:]) for t in (q, k, v)), attn_mask=bias)
    return out.unflatten(0, lead)


class GatedAttention(nn.Module):
    """forward(x (..., L, C), bias) -> (..., L, C). Output projection zero-initialised and gate
    bias 1 (AlphaFold's init: each residual update starts at 0 with an open gate)."""

    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.qkv = nn.Linear(dim, 3 * heads * head_dim, bias=False)
        self.gate = nn.Linear(dim, heads * head_dim)
        self.out = nn.Linear(heads * head_dim, dim)
        nn.init.zeros_(self.gate.weight)
        nn.init.ones_(self.gate.bias)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, self.head_dim)).movedim(-3, 0).transpose(-2, -3)
        o = biased_attention(q, k, v, bias).to(x.dtype)  # (..., H, L, c)
        return self.out(o.transpose(-2, -3).flatten(-2) * torch.sigmoid(self.gate(x)))
