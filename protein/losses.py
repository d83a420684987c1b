"""Losses of the folding model: backbone FAPE, distogram cross-entropy, pLDDT cross-entropy.

Coordinates are in Å; masks are (B, L) (1 = residue present). All three are float32 and average
over the present terms of the whole batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from protein.frames import Frames
from protein.metrics import lddt


def fape(pred_frames: Frames, true_frames: Frames, pred_points: torch.Tensor, true_points: torch.Tensor,
         frame_mask: torch.Tensor, point_mask: torch.Tensor, clamp: float | None = 10.0, scale: float = 10.0,
         eps: float = 1e-4) -> torch.Tensor:
    """Frame aligned point error (Algorithm 28): every point (B, L, 3) expressed in every frame (B, L),
    predicted against true; the distances sqrt(d² + eps), clamped at `clamp` Å (None: not clamped)
    and divided by `scale`, averaged over the present (frame, point) pairs. Invariant to global
    rotations and translations of either structure."""
    local_pred = pred_frames[:, :, None].invert_apply(pred_points[:, None])  # (B, frames, points, 3)
    local_true = true_frames[:, :, None].invert_apply(true_points[:, None])
    distance = torch.sqrt(((local_pred - local_true) ** 2).sum(-1) + eps)
    if clamp is not None:
        distance = distance.clamp(max=clamp)
    weights = frame_mask[:, :, None].float() * point_mask[:, None, :].float()
    return (distance / scale * weights).sum() / weights.sum().clamp_min(1.0)


def distogram_targets(positions: torch.Tensor, bins: int, first_edge: float = 2.3125, last_edge: float = 21.6875
                      ) -> torch.Tensor:
    """(B, L, 3) -> (B, L, L) long bin of each pairwise distance: `bins - 1` edges evenly spaced from
    first_edge to last_edge Å (AlphaFold's 64 bins), the first bin below, the last above."""
    edges = torch.linspace(first_edge, last_edge, bins - 1, device=positions.device)
    return torch.bucketize(torch.cdist(positions.float(), positions.float()), edges)


def distogram_loss(logits: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of distogram logits (B, L, L, bins) against the binned distances of positions
    (B, L, 3) (Cβ, Cα for glycine), over the pairs of present residues."""
    targets = distogram_targets(positions, logits.shape[-1])
    pair_mask = (mask[:, :, None] * mask[:, None, :]).float()
    losses = F.cross_entropy(logits.float().flatten(0, 2), targets.flatten(), reduction="none").view_as(pair_mask)
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
