"""Structure comparison on Cα atoms: RMSD after Kabsch, lDDT-Cα, TM-score and GDT-TS.

pred and true are (N, 3) coordinates in Å of the same residues (true is the reference); mask (N,)
bool marks the residues present in the reference (None: all). lDDT also takes batches (B, N, 3).
"""

from __future__ import annotations

import torch

from protein.superposition import superpose, superposition_search

LDDT_THRESHOLDS = (0.5, 1.0, 2.0, 4.0)
"""Å: a distance counts as preserved at each threshold its error stays under (lDDT)."""
GDT_CUTOFFS = (1.0, 2.0, 4.0, 8.0)
"""Å: GDT-TS averages the best fraction of residues within each cutoff."""


def _checked(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if pred.shape != true.shape or pred.shape[-1] != 3:
        raise ValueError(f"pred and true must both be (..., N, 3); got {tuple(pred.shape)} and {tuple(true.shape)}")
    mask = torch.ones(true.shape[:-1], dtype=torch.bool, device=true.device) if mask is None else mask.bool()
    if mask.shape != true.shape[:-1]:
        raise ValueError(f"mask must be {tuple(true.shape[:-1])}; got {tuple(mask.shape)}")
    return mask


def rmsd(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Root mean square deviation (Å, 0-d float64) of the masked residues after the Kabsch fit of pred onto true."""
    mask = _checked(pred, true, mask)
    moved = superpose(pred[mask], true[mask])
    return (moved - true[mask].double()).pow(2).sum(-1).mean().sqrt()


def lddt_pair_terms(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor | None = None,
                    cutoff: float = 15.0) -> tuple[torch.Tensor, torch.Tensor]:
    """lDDT's terms of every pair of pred (..., N, 3) against true: (counted, preserved), both (..., N,
    N) float64. counted is 1 for the pairs lDDT scores (distinct present residues closer than `cutoff`
    Å in true), else 0; preserved is counted times the fraction of the thresholds (0.5, 1, 2, 4 Å)
    within which pred keeps that pair's distance."""
    mask = _checked(pred, true, mask)
    true_distances = torch.cdist(true.double(), true.double())
    error = (torch.cdist(pred.double(), pred.double()) - true_distances).abs()
    counted = mask[..., :, None] & mask[..., None, :] & (true_distances < cutoff)
    counted &= ~torch.eye(true.shape[-2], dtype=torch.bool, device=true.device)
    kept = sum((error < t).double() for t in LDDT_THRESHOLDS) / len(LDDT_THRESHOLDS)
    return counted.double(), kept * counted


def lddt(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor | None = None, cutoff: float = 15.0,
         per_residue: bool = False) -> torch.Tensor:
    """Local distance difference test (Mariani et al., 2013) of pred (..., N, 3) against true: over
    the pairs of distinct present residues closer than `cutoff` Å in true, the fraction of distances
    pred preserves within 0.5, 1, 2 and 4 Å, averaged over the thresholds (`lddt_pair_terms`). No
    superposition. Returns (...) pooled over all pairs, or (..., N) per residue; in [0, 1]."""
    counted, preserved = lddt_pair_terms(pred, true, mask, cutoff)
    dims = (-1,) if per_residue else (-2, -1)
    return preserved.sum(dims) / counted.sum(dims).clamp_min(1)


def tm_d0(length: int) -> float:
    """TM-score's distance scale d0 (Å) for a reference of `length` residues (0.5 at 21 or fewer)."""
    return max(1.24 * (length - 15) ** (1 / 3) - 1.8, 0.5) if length > 21 else 0.5


def tm_score(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """TM-score (Zhang & Skolnick, 2004): max over superpositions of (1/L) Σ 1 / (1 + (d_i/d0)²),
    L the present residues of true, found by the TM-score program's fragment-seeded iterative search.
    0-d float64 in (0, 1]."""
    mask = _checked(pred, true, mask)
    length = int(mask.sum())
    d0 = tm_d0(length)
    return superposition_search(pred, true, mask, lambda d: (1 / (1 + (d / d0) ** 2)).sum(-1) / length,
                                select_cutoff=min(max(d0, 4.5), 8.0))


def gdt_ts(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Global distance test, total score: the mean over 1, 2, 4 and 8 Å of the largest fraction of
    the present residues that one superposition brings within that distance. 0-d float64 in [0, 1]."""
    mask = _checked(pred, true, mask)
    length = int(mask.sum())
    fractions = [superposition_search(pred, true, mask, lambda d, c=cutoff: (d < c).sum(-1).double() / length,
                                      select_cutoff=cutoff) for cutoff in GDT_CUTOFFS]
    return torch.stack(fractions).mean()
