"""AlphaFold's gated multi-head attention with additive biases, through SDPA in float32.

    x (..., L, C) -> q, k, v (..., H, L, c) -> softmax(q k^T / sqrt(c) + bias) v
    -> gate sigmoid(Linear(x)) -> Linear -> (..., L, C)

`bias` broadcasts against (..., H, L, L): a pair bias (B, 1, H, L, L) for MSA row and triangle
attention; `key_mask` (..., L) marks the keys present. The logits and softmax run in float32
(protein.precision).

SDPA's fused kernels (flash attention on CPU, memory-efficient attention on GPU) take q, k, v of
four dimensions (N, H, L, c) only; with more, SDPA falls back to its math path, which materialises
the logits and the softmax. The Evoformer's attentions have five ((B, rows, H, L, c)), so their
leading dimensions are merged into N first, and the pair bias goes in broadcast along the rows
rather than materialised with the key mask added (`biased_attention`): folding 256 residues with
fold-tiny on 2 cores went from 18 s and 1,350 MiB peak RSS to 5.6 s and 515 MiB (BENCHMARKS.md,
"Evoformer attention through SDPA's fused kernel").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from protein.precision import float32_island

MASK_LOGIT = -1e9
"""Added to the logits of masked keys."""


@float32_island
def biased_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None,
                     key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(c) + bias + MASK_LOGIT at masked keys) v in float32: q, k, v (..., H, L, c);
    bias None or broadcast to (..., H, L, L); key_mask None (every key present) or (..., L), 1 or
    True where a key is present.

    The leading dimensions are merged into one for SDPA's fused kernels (module docstring); the bias
    keeps its own head and query dimensions, so a pair bias (B, 1, H, L, L) goes in broadcast along
    the rows, never materialised. For that the key mask is not added to the bias: it enters as one
    more channel of q (sqrt(c)) and k (0 or MASK_LOGIT), and of v (0, dropped after). (On CPU a bias
    that requires a gradient still takes the math path: the flash kernel gives none.)"""
    width = q.shape[-1]
    if key_mask is not None:
        masked = (1.0 - key_mask.to(k.dtype)) * MASK_LOGIT  # (..., L)
        q = torch.cat([q, q.new_full((*q.shape[:-1], 1), width**0.5)], -1)
        k = torch.cat([k, masked[..., None, :, None].expand(*k.shape[:-1], 1)], -1)
        v = torch.cat([v, v.new_zeros((*v.shape[:-1], 1))], -1)
    lead = q.shape[:-3]
    if bias is not None:
        bias = bias.reshape((1,) * (q.ndim - bias.ndim) + tuple(bias.shape))
        bias = bias.expand(*lead, *bias.shape[-3:]).reshape(-1, *bias.shape[-3:])
    out = F.scaled_dot_product_attention(*(t.reshape(-1, *t.shape[-3:]) for t in (q, k, v)), attn_mask=bias,
                                         scale=width**-0.5)
    return out.reshape(*lead, *out.shape[-3:])[..., :width]


class GatedAttention(nn.Module):
    """forward(x (..., L, C), bias, key_mask) -> (..., L, C). Output projection zero-initialised and gate
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

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None, key_mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        """x (..., L, C), bias and key_mask as biased_attention's -> (..., L, C)."""
        q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, self.head_dim)).movedim(-3, 0).transpose(-2, -3)
        o = biased_attention(q, k, v, bias, key_mask).to(x.dtype)  # (..., H, L, c)
        return self.out(o.transpose(-2, -3).flatten(-2) * torch.sigmoid(self.gate(x)))
