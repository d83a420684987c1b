"""The realised fold's pLDDT as a fitted linear readout of per-residue features of the distogram,
the realised Cα trace, the sequence, the burial network's prediction and a per-pair network's.

    features = model.confidence_readout.features(logits (L, L, bins), ca (L, 3), sequence,
                                                 module_plddt (L,), model.burial.predict(sequence) (L, 4))
             = readout_features(..., pairs=model.confidence_readout.pairs.residue_features(logits, ca))  (L, F)
    plddt = model.confidence_readout(features)                                            (L,) in [0, 1]

`ConfidenceReadout` holds the readout as buffers of the folding model, and the per-pair network
(`protein.pair_confidence`) as a frozen submodule, so a checkpoint carries both.
Unfitted, it returns feature 0, `protein.confidence.distogram_lddt` (the expected lDDT-Cα under
the distogram), clamped to [0, 1]; `fit` sets it by ridge regression on realised folds of chains
the model never trained on, against their true per-residue lDDT-Cα (recipe `fold_tiny`,
`python -m protein.fit_confidence`).

Why: every reading of the distogram alone stops near Pearson r 0.40 on validation chains
(benchmarks/fold_confidence_readings.py), and what it misses is burial: residues with many true
neighbours lose lDDT to wrong long-range distances. The features below carry what the model says of
a residue's surroundings (expected and realised neighbour counts, the distance histogram of its
distant pairs, contacts predicted 12 or more residues apart), which no single reading combines, and
what the burial network (`protein.burial`) predicts of the true neighbour counts from the sequence,
which the distogram of a small model tells poorly, and what the per-pair network, fitted to
realised folds, expects lDDT-Cα to score of each pair, where the distogram is miscalibrated.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from protein.burial import BURIAL_TARGETS, DISTANT_SEPARATION
from protein.confidence import INCLUSION_RADIUS, TEMPERATURE, cumulative, pair_terms
from protein.losses import distogram_bin_bounds, distogram_bin_centres
from protein.pair_confidence import RESIDUE_FEATURES, PairConfidence
from protein.residues import KYTE_DOOLITTLE

FAR = DISTANT_SEPARATION
"""Residues at least this far apart in sequence form a "distant" pair (6, as for the burial network)."""
CONTACT_SEPARATION = 12
"""Residues at least this far apart count towards the predicted long-range contacts."""
DISTANCE_GROUPS = 8
"""The distogram's bins are pooled into this many groups of consecutive bins for the histograms."""
FEATURES = ("distogram_lddt", "distogram_lddt_distant", "distogram_lddt_near", "expected_neighbours",
            "expected_distant_neighbours", "realised_neighbours_15", "realised_neighbours_10",
            "realised_distant_neighbours_15", "entropy", "strain", "log_end_distance", "log_length",
            "hydrophobicity", "module_plddt",
            *(f"predicted_distant_group_{g}" for g in range(DISTANCE_GROUPS)),
            *(f"realised_distant_group_{g}" for g in range(DISTANCE_GROUPS)),
            "long_range_contacts_8", "long_range_contacts_12", *(f"predicted_{name}" for name in BURIAL_TARGETS),
            *RESIDUE_FEATURES)
"""The readout's features per residue i (sums over residues j != i; "distant": |i - j| >= FAR;
probabilities at temperature 1 unless said):
- distogram_lddt[_distant, _near]: the expected lDDT-Cα of protein.confidence (temperature 0.7)
  over all, distant and near (1 <= |i - j| < FAR) pairs;
- expected[_distant]_neighbours: Σ_j P(D_ij < 15 Å);
- realised_neighbours_15 / _10, realised_distant_neighbours_15: the realised fold's counts;
- entropy: the distogram's entropy (nats) averaged over j with weights P(D_ij < 15 Å);
- strain: |d_ij - E[D_ij]| averaged the same way (how far the realisation is from the distogram);
- log_end_distance: log(1 + residues to the nearer chain end); log_length: log L;
- hydrophobicity: Kyte-Doolittle; module_plddt: the pLDDT head's estimate for the structure module;
- predicted_distant_group_g: P(D_ij in the g-th group of bins) averaged over distant j;
  realised_distant_group_g: the fraction of distant j whose realised distance falls in that group;
- long_range_contacts_8 / _12: Σ_{|i - j| >= CONTACT_SEPARATION} P(D_ij < 8 / 12 Å);
- predicted_*: the burial network's log(1 + neighbour counts) from the sequence (protein.burial);
- pair_*: the per-pair network's expected lDDT-Cα and log(1 + expected neighbours and preserved
  pairs) (protein.pair_confidence.RESIDUE_FEATURES)."""
RIDGE = 1e-3
"""Ridge penalty per fitted residue on the standardised features' weights."""


def readout_features(logits: torch.Tensor, ca: torch.Tensor, sequence: str, module_plddt: torch.Tensor,
                     burial: torch.Tensor, pairs: torch.Tensor, rows: int = 64) -> torch.Tensor:
    """logits (L, L, bins) of the distogram head, ca (L, 3) Å the realised Cα, the (normalised)
    sequence, module_plddt (L,), burial (L, len(BURIAL_TARGETS)) the burial network's prediction,
    pairs (L, len(RESIDUE_FEATURES)) the per-pair network's -> (L, len(FEATURES)) float32, `rows`
    rows of the distogram at a time: no (L, L, bins) probabilities exist whole."""
    length, bins = ca.shape[0], logits.shape[-1]
    if logits.shape != (length, length, bins) or ca.shape != (length, 3) or len(sequence) != length \
            or module_plddt.shape != (length,) or burial.shape != (length, len(BURIAL_TARGETS)) \
            or pairs.shape != (length, len(RESIDUE_FEATURES)):
        raise ValueError(f"readout_features needs logits (L, L, bins), ca (L, 3), a sequence of L letters, "
                         f"module_plddt (L,), burial (L, {len(BURIAL_TARGETS)}) and pairs (L, {len(RESIDUE_FEATURES)}); "
                         f"got {tuple(logits.shape)}, {tuple(ca.shape)}, {len(sequence)} letters, "
                         f"{tuple(module_plddt.shape)}, {tuple(burial.shape)}, {tuple(pairs.shape)}")
    if bins % DISTANCE_GROUPS:
        raise ValueError(f"the distogram's {bins} bins do not split into {DISTANCE_GROUPS} groups")
    device = logits.device
    bounds = distogram_bin_bounds(bins).to(device)
    centres = distogram_bin_centres(bins).to(device).double()
    group_edges = bounds[bins // DISTANCE_GROUPS : -1 : bins // DISTANCE_GROUPS].contiguous()  # the groups' inner edges
    distances = torch.cdist(ca.double(), ca.double())
    index = torch.arange(length, device=device)
    blocks = []
    for start in range(0, length, rows):
        block = logits[start : start + rows].double()
        d = distances[start : start + rows]
        separation = (index[start : start + len(block), None] - index[None]).abs()
        others, distant = separation > 0, (separation >= FAR).double()
        near_pairs, contact_pairs = (others & (separation < FAR)).double(), (separation >= CONTACT_SEPARATION).double()
        others = others.double()
        sharp_kept, sharp_near = pair_terms((block / TEMPERATURE).softmax(-1), d)
        probabilities = block.softmax(-1)
        near = cumulative(probabilities, bounds, torch.full_like(d, INCLUSION_RADIUS)[..., None])[..., 0] * others
        contacts = cumulative(probabilities, bounds, torch.tensor([8.0, 12.0], dtype=torch.float64, device=device)
                              .repeat(*d.shape, 1))
        entropy = -(probabilities * probabilities.clamp_min(1e-30).log()).sum(-1)
        strain = (d - probabilities @ centres).abs()
        distant_count = distant.sum(-1).clamp_min(1)[:, None]
        groups = probabilities.unflatten(-1, (DISTANCE_GROUPS, -1)).sum(-1)
        realised_groups = nn.functional.one_hot(torch.bucketize(d, group_edges), DISTANCE_GROUPS).double()

        def ratio(weights: torch.Tensor) -> torch.Tensor:
            return (sharp_kept * weights).sum(-1) / (sharp_near * weights).sum(-1).clamp_min(1e-12)

        def weighted(values: torch.Tensor) -> torch.Tensor:
            return (values * near).sum(-1) / near.sum(-1).clamp_min(1e-12)

        position = index[start : start + len(block)].double()
        blocks.append(torch.cat([torch.stack([
            ratio(others), ratio(distant), ratio(near_pairs), near.sum(-1), (near * distant).sum(-1),
            ((d < INCLUSION_RADIUS) * others).sum(-1), ((d < 10) * others).sum(-1),
            ((d < INCLUSION_RADIUS) * distant).sum(-1),
            weighted(entropy), weighted(strain), torch.log1p(torch.minimum(position, length - 1 - position)),
            torch.full_like(position, math.log(length)),
            torch.tensor([KYTE_DOOLITTLE.get(a, 0.0) for a in sequence[start : start + len(block)]],
                         dtype=torch.float64, device=device),
            module_plddt[start : start + len(block)].double().to(device)], -1),
            (groups * distant[..., None]).sum(1) / distant_count,
            (realised_groups * distant[..., None]).sum(1) / distant_count,
            (contacts * contact_pairs[..., None]).sum(1), burial[start : start + len(block)].double().to(device),
            pairs[start : start + len(block)].double().to(device)], -1))
    return torch.cat(blocks).float()


class ConfidenceReadout(nn.Module):
    """forward(features (L, F)) -> (L,) float32 pLDDT in [0, 1]: clamp(((features - mean) / scale) @
    weight + bias). Buffers, not parameters: no optimiser touches them, `fit` sets them. `pairs`, the
    per-pair network whose residue features the readout reads, is frozen and fitted before it
    (protein.pair_confidence.train_pair_confidence)."""

    def __init__(self) -> None:
        super().__init__()
        self.pairs = PairConfidence().requires_grad_(False)
        count = len(FEATURES)
        self.register_buffer("mean", torch.zeros(count))
        self.register_buffer("scale", torch.ones(count))
        self.register_buffer("weight", nn.functional.one_hot(torch.tensor(0), count).float())  # distogram_lddt alone
        self.register_buffer("bias", torch.zeros(()))

    @torch.no_grad()
    def features(self, logits: torch.Tensor, ca: torch.Tensor, sequence: str, module_plddt: torch.Tensor,
                 burial: torch.Tensor) -> torch.Tensor:
        """readout_features of a realised fold (the arguments as there) with `pairs`' residue
        features -> (L, len(FEATURES)) float32."""
        return readout_features(logits, ca, sequence, module_plddt, burial,
                                self.pairs.residue_features(logits, ca, burial.to(logits.device)))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if features.shape[-1] != len(FEATURES):
            raise ValueError(f"features must have {len(FEATURES)} columns (FEATURES); got {tuple(features.shape)}")
        standard = (features.double() - self.mean.double()) / self.scale.double()
        return (standard @ self.weight.double() + self.bias.double()).clamp(0, 1).float()

    @torch.no_grad()
    def fit(self, features: torch.Tensor, targets: torch.Tensor, ridge: float = RIDGE) -> None:
        """features (N, F) of N residues, targets (N,) their true lDDT-Cα: set the buffers to the ridge
        regression (penalty ridge * N on the standardised weights, none on the bias)."""
        if features.ndim != 2 or features.shape[1] != len(FEATURES) or targets.shape != features.shape[:1]:
            raise ValueError(f"fit needs features (N, {len(FEATURES)}) and targets (N,); got {tuple(features.shape)} "
                             f"and {tuple(targets.shape)}")
        if features.shape[0] < 2 * len(FEATURES):
            raise ValueError(f"fit needs at least {2 * len(FEATURES)} residues; got {features.shape[0]}")
        x, y = features.double(), targets.double()
        mean, scale = x.mean(0), x.std(0)
        scale = torch.where(scale > 1e-6, scale, torch.ones_like(scale))  # a constant feature gets weight 0
        standard = (x - mean) / scale
        gram = standard.T @ standard + ridge * len(x) * torch.eye(len(FEATURES), dtype=torch.float64, device=x.device)
        weight = torch.linalg.solve(gram, standard.T @ (y - y.mean()))
        for name, value in (("mean", mean), ("scale", scale), ("weight", weight), ("bias", y.mean())):
            getattr(self, name).copy_(value)
