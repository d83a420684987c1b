"""Losses of the folding model: backbone FAPE, distogram cross-entropy, pLDDT cross-entropy.

Coordinates are in Å; masks are (B, L) (1 = residue present). All three are float32 and average
over the present terms of the whole batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from protein.chunking import chunked
from protein.frames import Frames
from protein.metrics import lddt


def fape(pred_frames: Frames, true_frames: Frames, pred_points: torch.Tensor, true_points: torch.Tensor,
         frame_mask: torch.Tensor, point_mask: torch.Tensor, clamp: float | None = 10.0, scale: float = 10.0,
         eps: float = 1e-4, chunk_size: int | None = None) -> torch.Tensor:
    """Frame aligned point error (Algorithm 28): every point (B, L, 3) expressed in every frame (B, L),
    predicted against true; the distances sqrt(d² + eps), clamped at `clamp` Å (None: not clamped)
    and divided by `scale`, averaged over the present (frame, point) pairs. Invariant to global
    rotations and translations of either structure. Computed `chunk_size` frames at a time."""

    def distances(pred_rotation, pred_translation, true_rotation, true_translation, pred_points, true_points):
        local_pred = Frames(pred_rotation, pred_translation)[:, :, None].invert_apply(pred_points[:, None])
        local_true = Frames(true_rotation, true_translation)[:, :, None].invert_apply(true_points[:, None])
        distance = torch.sqrt(((local_pred - local_true) ** 2).sum(-1) + eps)
        return distance if clamp is None else distance.clamp(max=clamp)  # (B, frames, points)

    distance = chunked(distances, (pred_frames.rotation, pred_frames.translation, true_frames.rotation,
                                   true_frames.translation), 1, chunk_size, whole=(pred_points, true_points))
    weights = frame_mask[:, :, None].float() * point_mask[:, None, :].float()
    return (distance / scale * weights).sum() / weights.sum().clamp_min(1.0)


DISTOGRAM_FIRST_EDGE, DISTOGRAM_LAST_EDGE = 2.3125, 21.6875
"""Å: the first and last of the distogram head's bin edges (AlphaFold's)."""


def distogram_bin_bounds(bins: int, first_edge: float = DISTOGRAM_FIRST_EDGE, last_edge: float = DISTOGRAM_LAST_EDGE
                         ) -> torch.Tensor:
    """(bins + 1,) float64 Å: the bounds of the distogram's bins, `bins - 1` edges evenly spaced from
    first_edge to last_edge Å (AlphaFold's 64 bins), the two open end bins closed at the inner width."""
    edges = torch.linspace(first_edge, last_edge, bins - 1, dtype=torch.float64)
    width = (last_edge - first_edge) / (bins - 2)
    return torch.cat([edges[:1] - width, edges, edges[-1:] + width])


def distogram_targets(positions: torch.Tensor, bins: int, first_edge: float = DISTOGRAM_FIRST_EDGE,
                      last_edge: float = DISTOGRAM_LAST_EDGE) -> torch.Tensor:
    """(B, L, 3) -> (B, L, L) long bin of each pairwise distance (`distogram_bin_bounds`): the first bin
    below first_edge, the last above last_edge."""
    edges = distogram_bin_bounds(bins, first_edge, last_edge)[1:-1].to(positions.device, torch.float32)
    return torch.bucketize(torch.cdist(positions.float(), positions.float()), edges)


def distogram_bin_centres(bins: int, first_edge: float = DISTOGRAM_FIRST_EDGE, last_edge: float = DISTOGRAM_LAST_EDGE
                          ) -> torch.Tensor:
    """(bins,) float32 Å: the middle of each bin of `distogram_bin_bounds`."""
    bounds = distogram_bin_bounds(bins, first_edge, last_edge)
    return ((bounds[1:] + bounds[:-1]) / 2).float()


def distogram_logits(head: nn.Linear, pair: torch.Tensor) -> torch.Tensor:
    """Symmetric distogram logits head(pair_ij + pair_ji) (B, L, L, bins) in float32 of a pair (B, L, L, Cz)."""
    return head(pair + pair.transpose(1, 2)).float()


def distogram_loss(head: nn.Linear, pair: torch.Tensor, positions: torch.Tensor,
                   mask: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """Cross-entropy of the `distogram_logits` of pair (B, L, L, Cz) against the binned distances of
    positions (B, L, 3) (Cβ, Cα for glycine), over the pairs of present residues (mask (B, L)).
    Computed `chunk_size` rows at a time: the (B, L, L, bins) logits need not exist whole."""

    def row_losses(rows, columns, targets):  # pair_ij, pair_ji (B, i, L, Cz), targets (B, i, L) -> (B, i, L)
        return F.cross_entropy(head(rows + columns).float().movedim(-1, 1), targets, reduction="none")

    targets = distogram_targets(positions, head.out_features)
    losses = chunked(row_losses, (pair, pair.transpose(1, 2), targets), 1, chunk_size)
    pair_mask = (mask[:, :, None] * mask[:, None, :]).float()
    return (losses * pair_mask).sum() / pair_mask.sum().clamp_min(1.0)


def plddt_targets(pred_ca: torch.Tensor, true_ca: torch.Tensor, mask: torch.Tensor, bins: int) -> torch.Tensor:
    """(B, L) long bin of each residue's lDDT-Cα (of the detached prediction against the truth), `bins`
    equal bins over [0, 1]."""
    scores = lddt(pred_ca.detach(), true_ca, mask.bool(), per_residue=True)
    return (scores * bins).long().clamp(max=bins - 1)


def plddt_loss(logits: torch.Tensor, pred_ca: torch.Tensor, true_ca: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of pLDDT logits (B, L, bins) against the binned lDDT-Cα of pred_ca (B, L, 3)."""
    targets = plddt_targets(pred_ca, true_ca, mask, logits.shape[-1])
    losses = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none").view_as(mask)
    return (losses * mask.float()).sum() / mask.float().sum().clamp_min(1.0)


def plddt_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """(..., bins) -> (...) expected lDDT-Cα in [0, 1] (bin centres weighted by probability)."""
    bins = logits.shape[-1]
    centres = (torch.arange(bins, device=logits.device, dtype=torch.float32) + 0.5) / bins
    return (logits.float().softmax(-1) * centres).sum(-1)
