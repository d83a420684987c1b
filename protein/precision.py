"""Precision rules of the folding model, in one place.

The model runs under bf16 autocast (`torch.autocast(..., dtype=torch.bfloat16)`); these ops stay
float32 (islands with autocast off, inputs cast up):
- softmax of attention logits with their pair biases (`attention_softmax` through SDPA in fp32),
- LayerNorm (`layer_norm`),
- the sums over the MSA in the outer product mean and over k in the triangle multiplication
  (`float32_einsum`),
- the structure module's frames, points and losses (`float32_island` around them).
Outputs of an island are float32; the next linear layer casts them back under autocast.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import TypeVar

import torch
import torch.nn.functional as F

T = TypeVar("T", bound=Callable)


def _up(value):
    """Floating tensors to at least float32 (float64 stays float64)."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(torch.promote_types(value.dtype, torch.float32))
    return value


def float32_island(function: T) -> T:
    """`function` run with autocast off and its floating tensor arguments cast to float32 (at least)."""

    @wraps(function)
    def island(*args, **kwargs):
        device = next((a.device.type for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)), "cpu")
        with torch.autocast(device, enabled=False):
            return function(*(_up(a) for a in args), **{k: _up(v) for k, v in kwargs.items()})

    return island  # type: ignore[return-value]


@float32_island
def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the last dimension in float32."""
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


@float32_island
def float32_einsum(equation: str, *operands: torch.Tensor) -> torch.Tensor:
    """torch.einsum with float32 operands and accumulation."""
    return torch.einsum(equation, *operands)


class LayerNorm(torch.nn.LayerNorm):
    """nn.LayerNorm computed in float32 under autocast (float32 output)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.weight, self.bias, self.eps)
