"""The structure module (Jumper et al., 2021, Algorithms 20-23): invariant point attention and
backbone frame updates, placing each residue's N, CA, C from its frame (no torsions).

    single (B, L, Cs), pair (B, L, L, Cz), mask (B, L)
    -> frames (B, L) per layer, backbone (B, L, 3, 3) N/CA/C in Å, final single (B, L, Cs)

Runs in float32 with autocast off (protein.precision): frames and points need the precision.
Weights are shared across layers; rotation gradients are stopped between layers (AlphaFold).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from protein.attention import MASK_LOGIT
from protein.chunking import chunked, per_chunk
from protein.frames import Frames, quaternion_update
from protein.precision import LayerNorm, float32_island


@dataclass(frozen=True)
class StructureConfig:
    """Shape of the structure module."""

    single_dim: int = 64
    """Cs: width of the single representation."""
    layers: int = 4
    """Iterations of IPA + transition + backbone update (weights shared)."""
    heads: int = 4
    """IPA heads."""
    head_dim: int = 16
    """Scalar query/key/value width per head."""
    query_points: int = 4
    """3D query/key points per head."""
    value_points: int = 8
    """3D value points per head."""
    dropout: float = 0.1
    """Dropout on the IPA and transition updates."""
    position_scale: float = 10.0
    """Å per unit of the predicted translation updates."""

    def __post_init__(self) -> None:
        for name in ("single_dim", "layers", "heads", "head_dim", "query_points", "value_points"):
            if getattr(self, name) < 1:
                raise ValueError(f"StructureConfig.{name} must be >= 1; got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0 or self.position_scale <= 0:
            raise ValueError(f"StructureConfig needs dropout in [0, 1) and position_scale > 0; got {self.dropout}, "
                             f"{self.position_scale}")


class InvariantPointAttention(nn.Module):
    """forward(single (B, L, Cs), pair (B, L, L, Cz), frames (B, L), mask (B, L), chunk_size=None,
    pair_norm=None) -> (B, L, Cs): attention whose logits add scalar q·k, a pair bias and minus the
    weighted squared distances of query and key points in the global frame; its outputs (scalar,
    points brought back to the local frame with their norms, pair) are invariant to global
    rotations and translations. Chunked along the queries i; `pair_norm` (position-wise) is
    applied to each chunk's rows of pair (None: pair is used as given)."""

    def __init__(self, config: StructureConfig, pair_dim: int) -> None:
        super().__init__()
        h, c, pq, pv = config.heads, config.head_dim, config.query_points, config.value_points
        self.config = config
        self.scalars = nn.Linear(config.single_dim, 3 * h * c, bias=False)
        self.points = nn.Linear(config.single_dim, h * (2 * pq + pv) * 3)
        self.pair_bias = nn.Linear(pair_dim, h, bias=False)
        self.head_weights = nn.Parameter(torch.full((h,), math.log(math.e - 1)))  # softplus -> 1
        self.out = nn.Linear(h * (c + pv * 4 + pair_dim), config.single_dim)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, single, pair, frames: Frames, mask, chunk_size: int | None = None,
                pair_norm: Callable[[torch.Tensor], torch.Tensor] | None = None):
        c = self.config
        h, pq, pv = c.heads, c.query_points, c.value_points
        q, k, v = self.scalars(single).unflatten(-1, (3, h, c.head_dim)).unbind(-3)  # (B, L, H, c)
        local_points = self.points(single).unflatten(-1, (h, 2 * pq + pv, 3))  # (B, L, H, P, 3)
        points = frames[:, :, None, None].apply(local_points)
        q_pts, k_pts, v_pts = points.split([pq, pq, pv], dim=-2)  # (B, L, H, P, 3) global
        key_mask = (1.0 - mask[:, None, :, None].float()) * MASK_LOGIT  # (B, 1, L, 1)
        norm = pair_norm or (lambda rows: rows)

        def queries(q_rows, q_pts_rows, pair_rows, rotation_rows, translation_rows, k, v, k_pts, v_pts, key_mask):
            pair_rows = norm(pair_rows)  # the chunk's queries i: rows (B, i, ...); keys whole
            point_weight = F.softplus(self.head_weights) * math.sqrt(2.0 / (9.0 * pq)) / 2
            # Σ_p |q_ip - k_jp|² expanded, so no (B, i, L, H, P, 3) difference tensor is formed
            distances = ((q_pts_rows**2).sum((-1, -2))[:, :, None] + (k_pts**2).sum((-1, -2))[:, None]
                         - 2 * torch.einsum("bihpx,bjhpx->bijh", q_pts_rows, k_pts))  # (B, i, L, H)
            logits = (torch.einsum("bihc,bjhc->bijh", q_rows, k) / math.sqrt(c.head_dim) + self.pair_bias(pair_rows)
                      - point_weight * distances) * math.sqrt(1.0 / 3.0)
            weights = (logits + key_mask).softmax(dim=2)  # over keys j
            scalar_out = torch.einsum("bijh,bjhc->bihc", weights, v)
            row_frames = Frames(rotation_rows, translation_rows)[:, :, None, None]
            point_out = row_frames.invert_apply(torch.einsum("bijh,bjhpx->bihpx", weights, v_pts))
            pair_out = torch.einsum("bijh,bijz->bihz", weights, pair_rows)
            point_norms = torch.sqrt((point_out**2).sum(-1) + 1e-8)  # eps: a finite gradient at the origin
            features = [scalar_out.flatten(-2), point_out.flatten(-3), point_norms.flatten(-2), pair_out.flatten(-2)]
            return self.out(torch.cat(features, dim=-1))

        return chunked(queries, (q, q_pts, pair, frames.rotation, frames.translation), 1, chunk_size,
                       whole=(k, v, k_pts, v_pts, key_mask))


class StructureModule(nn.Module):
    """forward(single, pair, mask, chunk_size=None) -> {"frames": [Frames (B, L)] one per layer,
    "backbone" (B, L, 3, 3) N/CA/C of the last layer in Å, "single" (B, L, Cs)} (Algorithm 20,
    without torsions). IPA runs chunk_size queries at a time, normalising its rows of the pair."""

    def __init__(self, config: StructureConfig, single_in: int, pair_dim: int) -> None:
        super().__init__()
        self.config = config
        self.single_norm, self.pair_norm = LayerNorm(single_in), LayerNorm(pair_dim)
        self.single_in = nn.Linear(single_in, config.single_dim)
        self.ipa = InvariantPointAttention(config, pair_dim)
        self.ipa_norm, self.transition_norm = LayerNorm(config.single_dim), LayerNorm(config.single_dim)
        width = config.single_dim
        self.transition = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                                        nn.Linear(width, width))
        self.backbone_update = nn.Linear(width, 6)
        for layer in (self.transition[-1], self.backbone_update):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    @float32_island
    def forward(self, single: torch.Tensor, pair: torch.Tensor, mask: torch.Tensor, chunk_size: int | None = None
                ) -> dict:
        c = self.config
        pair, pair_norm = per_chunk(self.pair_norm, pair, chunk_size)
        s = self.single_in(self.single_norm(single))
        frames = Frames.identity(s.shape[:2], device=s.device, dtype=s.dtype)
        trajectory = []
        for layer in range(c.layers):
            attended = self.ipa(s, pair, frames, mask, chunk_size, pair_norm)
            s = self.ipa_norm(s + F.dropout(attended, c.dropout, self.training))
            s = self.transition_norm(s + F.dropout(self.transition(s), c.dropout, self.training))
            update = self.backbone_update(s)
            frames = frames.compose(quaternion_update(torch.cat([update[..., :3], update[..., 3:] * c.position_scale], -1)))
            trajectory.append(frames)
            if layer < c.layers - 1:
                frames = frames.detach_rotation()
        return {"frames": trajectory, "backbone": frames.backbone(), "single": s}
