"""The confidence of a realised fold: each residue's lDDT-Cα expected under the model's own distogram.

    plddt = distogram_lddt(distogram_logits (L, L, bins), realised_ca (L, 3))      (L,) in [0, 1]

lDDT-Cα counts, for residue i, every residue j whose true distance D_ij is under 15 Å, and scores
|d_ij - D_ij| < t for t = 0.5, 1, 2 and 4 Å, d_ij the fold's distance. The distogram head gives a
distribution over D_ij (of Cβ, read as Cα distances as in `protein.realisation`); the expected
score is approximated by the ratio of expectations

    confidence_i = Σ_j mean_t P(|D_ij - d_ij| < t and D_ij < 15) / Σ_j P(D_ij < 15)      (j ≠ i)

with each bin's probability spread evenly over it (the two open end bins given the inner bins'
width) and the logits divided by TEMPERATURE first.

It is the first feature of the model's confidence readout (`protein.confidence_readout`), and the
pLDDT `protein.fold` writes where that readout is unfitted.

Why: the pLDDT head learnt the structure module's backbone, and the fold `protein.fold` writes is
the Cα trace realised from the distogram; against it the head's Pearson r with the true
per-residue lDDT is 0.19 (30 validation chains of the shipped `fold-tiny`), this confidence's 0.40;
other readings of the distogram gain at most 0.004 (benchmarks/fold_confidence_readings.py).
"""

from __future__ import annotations

import torch

from protein.losses import distogram_bin_bounds
from protein.metrics import LDDT_THRESHOLDS
INCLUSION_RADIUS = 15.0
"""Å: lDDT's cutoff on the true distance of a counted pair."""
TEMPERATURE = 0.7
"""The distogram logits are divided by this (sharpened) before the expectation: pooled Pearson r with
the realised folds' true per-residue lDDT-Cα, 30 validation chains of `fold-tiny`: 0.197 / 0.314 /
0.396 / 0.381 / 0.332 / 0.301 at 0.3 / 0.5 / 0.7 / 1.0 / 1.5 / 2.0."""


def cumulative(probabilities: torch.Tensor, bounds: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """P(D < x) for probabilities (..., bins) spread evenly inside bins with edges `bounds` (bins + 1,),
    at x (..., K) Å -> (..., K): 0 below the first edge, 1 above the last."""
    bins = probabilities.shape[-1]
    at_bounds = torch.cat([torch.zeros_like(probabilities[..., :1]), probabilities.cumsum(-1)], -1)
    right = torch.bucketize(x, bounds).clamp(1, bins)  # x lies in bin right - 1: bounds[right - 1] <= x < bounds[right]
    fraction = ((x - bounds[right - 1]) / (bounds[right] - bounds[right - 1])).clamp(0, 1)
    below, above = at_bounds.gather(-1, right - 1), at_bounds.gather(-1, right)
    return below + fraction * (above - below)


def pair_terms(probabilities: torch.Tensor, distances: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """probabilities (..., bins) of the distogram's bins, distances (...) Å the fold's -> the pairs'
    (preserved, near) (...) float64: P(D < 15 and |D - d| < t) averaged over lDDT's thresholds t, and
    P(D < 15), the two terms distogram_lddt sums over j."""
    bounds = distogram_bin_bounds(probabilities.shape[-1]).to(probabilities.device)
    thresholds = torch.tensor(LDDT_THRESHOLDS, dtype=torch.float64, device=probabilities.device)
    d = distances.double()[..., None]
    # P(D < 15), then P(D < min(d + t, 15)) and P(D < d - t) for every threshold t.
    points = torch.cat([torch.full_like(d, INCLUSION_RADIUS), (d + thresholds).clamp(max=INCLUSION_RADIUS),
                        d - thresholds], -1)
    below = cumulative(probabilities.double(), bounds, points)
    count = len(LDDT_THRESHOLDS)
    preserved = (below[..., 1 : 1 + count] - below[..., 1 + count :]).clamp_min(0).mean(-1)
    return preserved, below[..., 0]


def distogram_lddt(logits: torch.Tensor, ca: torch.Tensor, temperature: float = TEMPERATURE, rows: int = 64
                   ) -> torch.Tensor:
    """logits (L, L, bins) of the distogram head, ca (L, 3) Å the fold's Cα -> (L,) float32 expected
    lDDT-Cα per residue in [0, 1] (see the module docstring; 0 for a residue with no possible
    neighbour), `rows` rows at a time: no (L, L, bins) probabilities exist whole."""
    length = ca.shape[0]
    if ca.ndim != 2 or ca.shape[-1] != 3 or logits.ndim != 3 or logits.shape[:2] != (length, length):
        raise ValueError(f"distogram_lddt needs logits (L, L, bins) and ca (L, 3); got {tuple(logits.shape)} and "
                         f"{tuple(ca.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0; got {temperature}")
    distances = torch.cdist(ca.double(), ca.double())
    confidence = []
    for start in range(0, length, rows):
        preserved, near = pair_terms((logits[start : start + rows].double() / temperature).softmax(-1),
                                     distances[start : start + rows])
        others = torch.ones_like(near)
        others[torch.arange(len(near)), torch.arange(start, start + len(near))] = 0.0  # j ≠ i
        confidence.append((preserved * others).sum(-1) / (near * others).sum(-1).clamp_min(1e-12))
    return torch.cat(confidence).clamp(0, 1).float()
