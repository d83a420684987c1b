"""Realising the Cα trace from the predicted distogram, as trRosetta realises its predicted
restraints: the folding model's Cα moved until their distances match the distogram head's expected
distances, with consecutive Cα 3.80 Å apart.

    realised = realise(ca (L, 3), expected_distances(distogram_logits (L, L, bins)), RealisationConfig())

Why: the structure module of a small, briefly trained model draws the chain in, while its distogram
head, trained by cross-entropy on binned true distances, does not. In fold-tiny's folds of 40
validation chains consecutive Cα lie 2.56 ± 1.03 Å apart instead of 3.80, and predicted distances
are 0.68x the true ones at 1 residue apart, 0.46x at 8 and 0.32x at 16; realised, the folds' mean
lDDT-Cα goes from 0.199 to 0.379 (`benchmarks/fold_realisation.py`).

The positions minimise, by Adam from the model's Cα scaled to a mean step of 3.80 Å,

    mean over pairs i != j with E[D_ij] < max_distance of (|x_i - x_j| - E[D_ij])²
    + bond_weight * mean over i of (|x_{i+1} - x_i| - 3.80)²

Distances cannot tell a fold from its mirror image; the start, the model's own trace, sets the
handedness (an α-helix when the model puts every Cα in one place). The distogram is of Cβ (Cα for
glycine), read here as Cα distances, an approximation; the bond term holds consecutive residues at
the Cα step whatever their Cβ distance.
"""

from __future__ import annotations

from dataclasses import dataclass

import math

import torch

from protein.baselines import CA_STEP, trace_from_angles
from protein.losses import distogram_bin_centres

HELIX_ANGLE, HELIX_DIHEDRAL = math.radians(91.0), math.radians(50.0)
"""The α-helix's virtual Cα bond angle and dihedral: the start when the model gives none."""


@dataclass(frozen=True)
class RealisationConfig:
    """How the Cα trace is fitted to the distogram (see the module docstring)."""

    steps: int = 400
    """Adam steps (validation lDDT-Cα of fold-tiny's realised folds, 40 chains: 0.376 at 200, 0.379 at
    400, 0.377 at 800)."""
    learning_rate: float = 0.05
    """Adam's step size, Å."""
    max_distance: float = 15.0
    """Pairs whose expected distance is at least this are left free, Å (lDDT's inclusion radius;
    validation lDDT-Cα 0.372 / 0.379 / 0.308 / 0.281 at 12 / 15 / 18 / 21 Å, TM-score 0.162 / 0.170 /
    0.177 / 0.188)."""
    bond_weight: float = 10.0
    """Weight of the consecutive-Cα term against the distance term (validation lDDT-Cα 0.376 / 0.379 /
    0.366 at 1 / 10 / 100)."""

    def __post_init__(self) -> None:
        if self.steps < 0 or self.learning_rate <= 0 or self.max_distance <= 0 or self.bond_weight < 0:
            raise ValueError(f"RealisationConfig needs steps >= 0, learning_rate > 0, max_distance > 0 and "
                             f"bond_weight >= 0; got {self}")


def expected_distances(logits: torch.Tensor, rows: int = 64) -> torch.Tensor:
    """(L, L, bins) distogram logits -> (L, L) float32 expected distance in Å under each pair's
    predicted distribution (bins read at their centres), `rows` rows at a time: no (L, L, bins)
    probabilities exist whole."""
    centres = distogram_bin_centres(logits.shape[-1]).to(logits.device)
    return torch.cat([block.float().softmax(-1) @ centres for block in logits.split(rows)])


def realise(ca: torch.Tensor, expected: torch.Tensor, config: RealisationConfig = RealisationConfig()) -> torch.Tensor:
    """ca (L, 3) Å the model's Cα, expected (L, L) Å the distogram's expected distances -> (L, 3)
    float32 realised Cα (see the module docstring); a chain of fewer than 2 residues is returned as it is."""
    if ca.ndim != 2 or ca.shape[-1] != 3 or expected.shape != (ca.shape[0], ca.shape[0]):
        raise ValueError(f"realise needs ca (L, 3) and expected (L, L); got {tuple(ca.shape)} and {tuple(expected.shape)}")
    if ca.shape[0] < 2:
        return ca.float()
    start = ca.double()
    steps = (start[1:] - start[:-1]).norm(dim=-1)
    if steps.mean() < 1e-3:  # every Cα in one place (an untrained model): no gradient would part them
        start = trace_from_angles(torch.full((ca.shape[0] - 2,), HELIX_ANGLE, dtype=torch.float64),
                                  torch.full((max(ca.shape[0] - 3, 0),), HELIX_DIHEDRAL, dtype=torch.float64))
    start = (start - start.mean(0)) * (CA_STEP / (start[1:] - start[:-1]).norm(dim=-1).mean())
    target = expected.double()
    weight = (target < config.max_distance).double()
    weight.fill_diagonal_(0.0)
    weight = weight / weight.sum().clamp_min(1.0)
    with torch.enable_grad():
        x = start.clone().requires_grad_(True)
        optimiser = torch.optim.Adam([x], lr=config.learning_rate)
        for _ in range(config.steps):
            optimiser.zero_grad()
            distance_term = ((torch.cdist(x, x) - target).square() * weight).sum()
            bond_term = ((x[1:] - x[:-1]).norm(dim=-1) - CA_STEP).square().mean()
            (distance_term + config.bond_weight * bond_term).backward()
            optimiser.step()
    return x.detach().float()
