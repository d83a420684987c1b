"""A learned estimate, pair by pair, of what lDDT-Cα will score on a realised fold, pooled per residue
for the confidence readout.

    inputs = pair_inputs(logits (R, L, bins), distances (R, L), separation (R, L),
                         burial_i (R, L, 4), burial_j (R, L, 4))                           (R, L, PAIR_INPUTS)
    contact, preserved = PairConfidence()(inputs).sigmoid().unbind(-1)                    (R, L) each
    features = PairConfidence().residue_features(logits (L, L, bins), ca (L, 3), burial (L, 4))  (L, 3)
    train_pair_confidence(net, [pair_examples(logits, ca, true_ca, burial, pairs, generator), ...])

lDDT-Cα scores residue i over the residues j whose true distance is under 15 Å, each by the
fraction of its thresholds within which the realised distance d_ij lies. For each pair the network
reads what the model says of it (the distogram pooled into PAIR_GROUPS groups of bins, the realised
distance, the burial network's prediction for i and for j, the lDDT terms expected under the
distogram at temperature 1 and 0.7, the sequence separation, the entropy) and predicts two
probabilities: `contact`, that the true distance is under 15 Å, and `preserved`, contact times the
fraction of thresholds met (PAIR_OUTPUTS). Summed over j they give residue i's lDDT-Cα and neighbour
count as the network expects them (RESIDUE_FEATURES), which the confidence readout reads
(`protein.confidence_readout`).

Why: `protein.confidence.distogram_lddt` takes the distogram at its word, and a small model's
distogram is miscalibrated in ways that depend on the distance, the separation and the realisation
(a pair placed at 6 Å by the realisation whose distogram spreads over 5-20 Å). A network fitted to
realised folds of chains the model never trained on learns that calibration. The network is fitted
with the readout (`python -m protein.fit_confidence`) and held by it, frozen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from protein.burial import BURIAL_TARGETS
from protein.confidence import INCLUSION_RADIUS, TEMPERATURE, pair_terms
from protein.metrics import lddt_pair_terms

PAIR_GROUPS = 16
"""The distogram's bins are pooled into this many groups of consecutive bins for the network."""
REALISED_EDGES = (4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 12.0, 14.0, 16.0, 18.0, 20.0, 24.0, 28.0, 32.0)
"""Å: the realised distance enters one-hot in the intervals these edges bound (and as a number)."""
SEPARATION_EDGES = (2, 3, 4, 5, 7, 9, 13, 17, 25, 49)
"""|i - j| enters one-hot in the intervals these edges bound (and as log(1 + |i - j|))."""
PAIR_NUMBERS = ("realised_distance", "preserved", "near", "sharp_preserved", "sharp_near", "log_separation", "entropy")
"""The inputs after the one-hots: min(d, 40 Å) / 20, pair_terms' two terms at temperature 1 and at
protein.confidence.TEMPERATURE, log(1 + |i - j|) / 5, the distogram's entropy (nats)."""
PAIR_INPUTS = PAIR_GROUPS + len(REALISED_EDGES) + 1 + len(SEPARATION_EDGES) + 1 + 2 * len(BURIAL_TARGETS) \
    + len(PAIR_NUMBERS)
"""Inputs per pair (pair_inputs): the pooled distogram, the two one-hots, the burial network's
prediction for i and for j (protein.burial; where the distogram errs depends on how buried the two
residues are), PAIR_NUMBERS."""
PAIR_OUTPUTS = ("contact", "preserved")
"""The network's two logits per pair: P(true distance < 15 Å), and that times the fraction of lDDT's
thresholds the realised distance meets."""
RESIDUE_FEATURES = ("pair_lddt", "pair_neighbours", "pair_preserved")
"""Per residue i, over j != i: Σ preserved / Σ contact, log(1 + Σ contact), log(1 + Σ preserved)."""
HIDDEN = 128
"""Width of the network's two hidden layers."""


def pair_inputs(logits: torch.Tensor, distances: torch.Tensor, separation: torch.Tensor, burial_i: torch.Tensor,
                burial_j: torch.Tensor) -> torch.Tensor:
    """logits (R, L, bins) of R rows of the distogram, distances (R, L) Å of the realised fold,
    separation (R, L) |i - j|, burial_i and burial_j (R, L, len(BURIAL_TARGETS)) the burial network's
    prediction for each pair's i and j -> (R, L, PAIR_INPUTS) float32 (see the module docstring)."""
    bins, context = logits.shape[-1], (*distances.shape, len(BURIAL_TARGETS))
    if bins % PAIR_GROUPS or distances.shape != logits.shape[:-1] or separation.shape != distances.shape \
            or burial_i.shape != context or burial_j.shape != context:
        raise ValueError(f"pair_inputs needs logits (R, L, bins) with bins a multiple of {PAIR_GROUPS}, distances and "
                         f"separation (R, L), burial_i and burial_j (R, L, {len(BURIAL_TARGETS)}); got "
                         f"{tuple(logits.shape)}, {tuple(distances.shape)}, {tuple(separation.shape)}, "
                         f"{tuple(burial_i.shape)}, {tuple(burial_j.shape)}")
    probabilities = logits.float().softmax(-1)
    preserved, near = pair_terms(probabilities, distances)
    sharp_preserved, sharp_near = pair_terms((logits.float() / TEMPERATURE).softmax(-1), distances)
    entropy = -(probabilities * probabilities.clamp_min(1e-9).log()).sum(-1)
    capped = distances.float().clamp(max=40.0)
    realised = torch.tensor(REALISED_EDGES, device=logits.device)
    apart = torch.tensor(SEPARATION_EDGES, device=logits.device)
    return torch.cat([
        probabilities.unflatten(-1, (PAIR_GROUPS, -1)).sum(-1),
        nn.functional.one_hot(torch.bucketize(capped, realised), len(REALISED_EDGES) + 1).float(),
        nn.functional.one_hot(torch.bucketize(separation, apart, right=True), len(SEPARATION_EDGES) + 1).float(),
        burial_i.float(), burial_j.float(),
        torch.stack([capped / 20, preserved.float(), near.float(), sharp_preserved.float(), sharp_near.float(),
                     separation.float().log1p() / 5, entropy], -1)], -1)


def pair_targets(ca: torch.Tensor, true_ca: torch.Tensor) -> torch.Tensor:
    """ca (L, 3) Å realised, true_ca (L, 3) Å -> (L, L, 2) float32 (contact, preserved) of every pair,
    lDDT-Cα's own terms (`protein.metrics.lddt_pair_terms`): 0 on the diagonal."""
    return torch.stack(lddt_pair_terms(ca, true_ca, cutoff=INCLUSION_RADIUS), -1).float()


def separations(rows: slice, length: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(R, L) long |i - j| for i in rows, j < length."""
    index = torch.arange(length, device=device)
    return (index[rows, None] - index[None]).abs()


def pair_examples(logits: torch.Tensor, ca: torch.Tensor, true_ca: torch.Tensor, burial: torch.Tensor, pairs: int,
                  generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One realised fold: logits (L, L, bins), ca (L, 3) realised, true_ca (L, 3), burial (L,
    len(BURIAL_TARGETS)) the burial network's prediction -> (inputs (P,
    PAIR_INPUTS), targets (P, 2)) of P = min(pairs, L * (L - 1)) pairs i != j drawn without
    replacement by `generator`."""
    length = len(ca)
    if logits.shape[:2] != (length, length) or ca.shape != (length, 3) or true_ca.shape != (length, 3) \
            or burial.shape != (length, len(BURIAL_TARGETS)):
        raise ValueError(f"pair_examples needs logits (L, L, bins), ca and true_ca (L, 3), burial (L, "
                         f"{len(BURIAL_TARGETS)}); got {tuple(logits.shape)}, {tuple(ca.shape)}, {tuple(true_ca.shape)}, "
                         f"{tuple(burial.shape)}")
    off_diagonal = (~torch.eye(length, dtype=torch.bool)).nonzero()
    i, j = off_diagonal[torch.randperm(len(off_diagonal), generator=generator)[:pairs]].T
    distances = (ca[i].double() - ca[j].double()).norm(dim=-1)
    inputs = pair_inputs(logits[i, j][None], distances[None], (i - j).abs()[None], burial[i][None], burial[j][None])[0]
    return inputs, pair_targets(ca, true_ca)[i, j]


class PairConfidence(nn.Module):
    """forward(inputs (..., PAIR_INPUTS)) -> (..., 2) logits of PAIR_OUTPUTS: two hidden GELU layers
    of HIDDEN on the inputs standardised by the buffers mean and scale (set by train_pair_confidence)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(PAIR_INPUTS))
        self.register_buffer("scale", torch.ones(PAIR_INPUTS))
        self.net = nn.Sequential(nn.Linear(PAIR_INPUTS, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN), nn.GELU(),
                                 nn.Linear(HIDDEN, len(PAIR_OUTPUTS)))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.net((inputs - self.mean) / self.scale)

    @torch.no_grad()
    def residue_features(self, logits: torch.Tensor, ca: torch.Tensor, burial: torch.Tensor, rows: int = 64
                         ) -> torch.Tensor:
        """logits (L, L, bins) of the distogram, ca (L, 3) Å realised, burial (L, len(BURIAL_TARGETS)) the
        burial network's prediction -> (L, len(RESIDUE_FEATURES))
        float32, `rows` rows at a time: no (L, L, PAIR_INPUTS) tensor exists whole."""
        length = len(ca)
        if logits.shape[:2] != (length, length) or ca.shape != (length, 3) or burial.shape != (length, len(BURIAL_TARGETS)):
            raise ValueError(f"residue_features needs logits (L, L, bins), ca (L, 3) and burial (L, {len(BURIAL_TARGETS)}); "
                             f"got {tuple(logits.shape)}, {tuple(ca.shape)} and {tuple(burial.shape)}")
        distances = torch.cdist(ca.double(), ca.double())
        sums = []
        for start in range(0, length, rows):
            block = slice(start, min(start + rows, length))
            separation = separations(block, length, logits.device)
            context = (len(separation), length, burial.shape[-1])
            inputs = pair_inputs(logits[block], distances[block], separation, burial[block, None].expand(context),
                                 burial[None].expand(context))
            expected = self(inputs).sigmoid() * (separation > 0)[..., None]
            sums.append(expected.sum(1))
        contact, preserved = torch.cat(sums).double().unbind(-1)
        return torch.stack([preserved / contact.clamp_min(1e-6), contact.log1p(), preserved.log1p()], -1).float()


@dataclass(frozen=True)
class PairTraining:
    """How `train_pair_confidence` fits the network: Adam, binary cross-entropy on both outputs."""

    pairs_per_chain: int = 6000
    """Pairs drawn from each realised fold (pair_examples)."""
    epochs: int = 8
    """Passes over the drawn pairs."""
    batch: int = 4096
    """Pairs per step."""
    learning_rate: float = 2e-3
    """Adam's step size."""
    seed: int = 0
    """Seeds the draw of the pairs and their order."""

    def __post_init__(self) -> None:
        if min(self.pairs_per_chain, self.epochs, self.batch) < 1 or self.learning_rate <= 0:
            raise ValueError(f"PairTraining needs pairs_per_chain, epochs and batch >= 1 and learning_rate > 0; "
                             f"got {self}")


def train_pair_confidence(net: PairConfidence, examples: Sequence[tuple[torch.Tensor, torch.Tensor]],
                          training: PairTraining = PairTraining()) -> list[float]:
    """Fit `net` (in place, trainable for the fit and frozen after) to the examples (pair_examples'
    (inputs (P, PAIR_INPUTS), targets (P, 2)) of each fold) -> the mean loss of each epoch."""
    if not examples:
        raise ValueError("train_pair_confidence needs at least one fold's examples")
    device = net.mean.device
    inputs, targets = torch.cat([x for x, _ in examples]).to(device), torch.cat([y for _, y in examples]).to(device)
    generator = torch.Generator().manual_seed(training.seed)
    with torch.random.fork_rng(devices=[]):  # the layers' initial weights, seeded without touching the global stream
        torch.manual_seed(training.seed)
        for layer in net.net:
            if isinstance(layer, nn.Linear):
                layer.reset_parameters()
    with torch.no_grad():
        net.mean.copy_(inputs.mean(0))
        net.scale.copy_(inputs.std(0).clamp_min(1e-6))
    net.requires_grad_(True)
    net.train()
    optimiser = torch.optim.Adam(net.net.parameters(), lr=training.learning_rate)
    losses = []
    try:
        with torch.enable_grad():
            for _ in range(training.epochs):
                total = torch.zeros((), device=device)  # summed on the device: no sync per step
                for batch in torch.randperm(len(inputs), generator=generator).to(device).split(training.batch):
                    loss = nn.functional.binary_cross_entropy_with_logits(net(inputs[batch]), targets[batch])
                    optimiser.zero_grad()
                    loss.backward()
                    optimiser.step()
                    total += loss.detach() * len(batch)
                losses.append(total.item() / len(inputs))
    finally:
        net.requires_grad_(False)
        net.eval()
    return losses
