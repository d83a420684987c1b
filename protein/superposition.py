"""Optimal rigid superposition (Kabsch) and the superposition search that TM-score and GDT-TS maximise over.

Point sets are (..., N, 3) float tensors in Å; weights (..., N) choose (or weigh) the residues the
fit is made on. Everything is computed in float64.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def kabsch(mobile: torch.Tensor, target: torch.Tensor, weights: torch.Tensor | None = None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The proper rotation R (..., 3, 3) and translation t (..., 3) minimising the weighted
    Σ w_i |R mobile_i + t - target_i|²; mobile, target (..., N, 3), weights (..., N) >= 0 with a
    positive sum (None: all 1)."""
    if mobile.shape != target.shape or mobile.shape[-1] != 3:
        raise ValueError(f"mobile and target must both be (..., N, 3); got {tuple(mobile.shape)} and {tuple(target.shape)}")
    mobile, target = mobile.double(), target.double()
    weights = torch.ones(mobile.shape[:-1], dtype=torch.float64, device=mobile.device) if weights is None else weights.double()
    w = (weights / weights.sum(-1, keepdim=True).clamp_min(1e-12))[..., None]
    mobile_centre, target_centre = (w * mobile).sum(-2), (w * target).sum(-2)
    covariance = ((mobile - mobile_centre[..., None, :]) * w).transpose(-1, -2) @ (target - target_centre[..., None, :])
    u, _, vt = torch.linalg.svd(covariance)
    sign = torch.sign(torch.linalg.det(vt.transpose(-1, -2) @ u.transpose(-1, -2)))  # -1: the fit would be a reflection
    flip = torch.ones_like(u[..., 0])
    flip[..., 2] = torch.where(sign == 0, torch.ones_like(sign), sign)
    rotation = vt.transpose(-1, -2) @ (flip[..., None] * u.transpose(-1, -2))
    return rotation, target_centre - (rotation @ mobile_centre[..., None])[..., 0]


def superpose(mobile: torch.Tensor, target: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """mobile (..., N, 3) moved onto target by the weighted Kabsch fit (float64)."""
    rotation, translation = kabsch(mobile, target, weights)
    return mobile.double() @ rotation.transpose(-1, -2) + translation[..., None, :]


def seed_fragments(mask: torch.Tensor, shortest: int = 4) -> torch.Tensor:
    """(S, N) bool: contiguous runs of the present residues (mask (N,) bool) of lengths L, L/2, L/4,
    ... down to `shortest`, starting every half-length: the initial fits of the search."""
    present = mask.nonzero().squeeze(1)
    count = present.numel()
    lengths = [count]
    while lengths[-1] > shortest:
        lengths.append(max(lengths[-1] // 2, shortest))
    seeds = []
    for length in lengths:
        for start in range(0, count - length + 1, max(1, length // 2)):
            seed = torch.zeros_like(mask)
            seed[present[start : start + length]] = True
            seeds.append(seed)
    return torch.stack(seeds)


def superposition_search(mobile: torch.Tensor, target: torch.Tensor, mask: torch.Tensor,
                         score: Callable[[torch.Tensor], torch.Tensor], select_cutoff: float,
                         iterations: int = 20) -> torch.Tensor:
    """Max over superpositions of score(distances) (a 0-d tensor): the search of the TM-score program.
    Every seed fragment is fitted, then refitted on the residues within `select_cutoff` Å of the
    target (widened by 0.5 Å until at least 3 are), `iterations` times; all seeds run at once.
    mobile, target (N, 3); mask (N,) bool, the residues scored. `score` maps distances (S, N)
    (inf where masked) to (S,)."""
    if int(mask.sum()) < 3:
        raise ValueError(f"a superposition needs at least 3 residues; got {int(mask.sum())}")
    mobile, target = mobile.double(), target.double()
    weights = seed_fragments(mask).double()
    best = torch.tensor(-float("inf"), dtype=torch.float64)
    for _ in range(iterations + 1):
        moved = superpose(mobile.expand(len(weights), -1, -1), target.expand(len(weights), -1, -1), weights)
        distances = (moved - target).norm(dim=-1).masked_fill(~mask, float("inf"))  # (S, N)
        best = torch.maximum(best, score(distances).max())
        cutoff = torch.full((len(weights), 1), select_cutoff, dtype=torch.float64)
        while True:
            selected = distances < cutoff
            short = selected.sum(-1, keepdim=True) < min(3, int(mask.sum()))
            if not short.any():
                break
            cutoff = torch.where(short, cutoff + 0.5, cutoff)
        weights = selected.double()
    return best
