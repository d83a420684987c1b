"""Rotary position embedding (Su et al., RoFormer): each query/key head vector is rotated, pair of
channels by pair, by angles proportional to its position, so that q.k depends on the positions'
difference only. Channels are paired half against half (i with i + D/2), as in GPT-NeoX and
Hugging Face's Llama.

Rotating saves nothing of size for backward: the products with the (S, D/2) cos/sin tables keep
only the tables.
"""

from __future__ import annotations

import torch


def rotary_tables(length: int, head_dim: int, base: float = 10000.0, device: torch.device | None = None,
                  dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each (length, head_dim / 2): angle of position p and pair i is
    p * base^(-2i / head_dim)."""
    if head_dim % 2:
        raise ValueError(f"rotary embedding needs an even head dimension; got {head_dim}")
    inverse = base ** -(torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
    angles = torch.arange(length, dtype=torch.float64, device=device)[:, None] * inverse
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, S, D) rotated by the (S, D/2) tables of `rotary_tables`: (B, H, S, D)."""
    if cos.shape != (x.shape[-2], x.shape[-1] // 2) or sin.shape != cos.shape:
        raise ValueError(f"cos and sin must be (S, D/2) = {(x.shape[-2], x.shape[-1] // 2)}; "
                         f"got {tuple(cos.shape)} and {tuple(sin.shape)}")
    first, second = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)
