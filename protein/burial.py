"""Burial from the sequence alone: a small dilated convolution network that predicts how many
residues of the true structure lie near each residue, read by the confidence readout.

    targets = neighbour_counts(ca (L, 3), present (L,))            (L, 4) log(1 + count)
    predicted = model.burial(input_ids (B, L), mask (B, L))         (B, L, 4) the same, predicted
    train_burial(model.burial, chains, BurialTraining())           fitted to true structures

Why: a residue's lDDT-Cα is lost mostly to its long-range neighbours, so how buried a residue is
decides much of how well its surroundings are placed, and the distogram of a small model tells that
poorly. This network learns it from the training chains' true structures (no fold needed):
fold-tiny's, trained for 6 epochs over its 15,697 training chains, predicts log(1 + neighbours
within 15 Å) at Pearson r 0.663 on the 829 validation chains its readout was fitted on
(zoo/weights/fold-tiny/confidence_fit.log). It sees the sequence only, so it runs on any sequence
`protein.fold` is given; the folding model holds it frozen (the trainer leaves parameters without
`requires_grad` alone) and `train_burial` fits it after the model is trained
(`python -m protein.fit_confidence`, recipe `fold_tiny`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch
from torch import nn

from protein.confidence import INCLUSION_RADIUS
from protein.residues import ALPHABET_SIZE, UNKNOWN_ID, sequence_ids

CLOSE_RADIUS = 10.0
"""Å: the tighter shell the network also counts."""
DISTANT_SEPARATION = 6
"""Residues at least this far apart in sequence count as distant neighbours."""
BURIAL_TARGETS = ("neighbours_15", "distant_neighbours_15", "neighbours_10", "distant_neighbours_10")
"""What the network predicts per residue i, each as log(1 + count): the residues j != i whose Cα
lies within INCLUSION_RADIUS (15 Å) or CLOSE_RADIUS (10 Å) of i's in the true structure, all of
them or only those with |i - j| >= DISTANT_SEPARATION; residues without a Cα count for nothing."""


@dataclass
class BurialConfig:
    """Shape of the burial network: an embedding, residual dilated convolutions, a linear readout."""

    width: int = 64
    """Channels of every layer."""
    dilations: tuple[int, ...] = (1, 2, 4, 8, 1, 2)
    """One residual convolution layer per entry, with this dilation (the defaults see ±72 residues)."""
    kernel_size: int = 9
    """Taps of every convolution (odd)."""

    def __post_init__(self) -> None:
        self.dilations = tuple(self.dilations)  # a list as read back from config.json
        if self.width < 1 or self.kernel_size < 1 or self.kernel_size % 2 == 0 or not self.dilations \
                or min(self.dilations) < 1:
            raise ValueError(f"BurialConfig needs width >= 1, an odd kernel_size and dilations >= 1; got {self}")


def neighbour_counts(ca: torch.Tensor, present: torch.Tensor | None = None) -> torch.Tensor:
    """ca (L, 3) Å of the true structure, present (L,) bool (None: all) -> (L, len(BURIAL_TARGETS))
    float32 log(1 + count) of each residue's neighbours (BURIAL_TARGETS)."""
    if ca.ndim != 2 or ca.shape[-1] != 3:
        raise ValueError(f"ca must be (L, 3); got {tuple(ca.shape)}")
    present = torch.ones(len(ca), dtype=torch.bool, device=ca.device) if present is None else present
    distances = torch.cdist(ca.double(), ca.double())
    index = torch.arange(len(ca), device=ca.device)
    separation = (index[:, None] - index[None]).abs()
    pairs = present[:, None] & present[None] & (separation > 0)
    distant = pairs & (separation >= DISTANT_SEPARATION)
    counts = [((distances < radius) & kept).sum(-1) for radius in (INCLUSION_RADIUS, CLOSE_RADIUS)
              for kept in (pairs, distant)]
    return torch.stack(counts, -1).float().log1p()


class BurialNet(nn.Module):
    """forward(input_ids (B, L) long, mask (B, L) bool) -> (B, L, len(BURIAL_TARGETS)) float32
    predicted log(1 + neighbour counts). Each residue is embedded with its amino acid and where it
    sits: log(1 + residues to the nearer end), log L and its fraction of the way along the chain."""

    def __init__(self, config: BurialConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(ALPHABET_SIZE, config.width)
        self.place = nn.Linear(3, config.width)
        self.norms = nn.ModuleList(nn.LayerNorm(config.width) for _ in config.dilations)
        self.convolutions = nn.ModuleList(
            nn.Conv1d(config.width, config.width, config.kernel_size, padding=dilation * (config.kernel_size // 2),
                      dilation=dilation) for dilation in config.dilations)
        self.out = nn.Linear(config.width, len(BURIAL_TARGETS))

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if input_ids.ndim != 2 or mask.shape != input_ids.shape:
            raise ValueError(f"BurialNet needs input_ids and mask (B, L); got {tuple(input_ids.shape)} and "
                             f"{tuple(mask.shape)}")
        keep = mask.to(self.out.weight.dtype)[..., None]
        length = keep.sum(1, keepdim=True).clamp_min(1)  # (B, 1, 1)
        position = torch.arange(input_ids.shape[1], device=input_ids.device, dtype=keep.dtype)[None, :, None]
        position = position.expand(len(input_ids), -1, -1)  # (B, L, 1)
        to_end = torch.minimum(position, length - 1 - position).clamp_min(0)
        place = torch.cat([to_end.log1p() / 5, length.log().expand_as(position) / 6, position / length], -1)
        x = self.embed(input_ids) + self.place(place)
        for norm, convolution in zip(self.norms, self.convolutions):
            x = x + nn.functional.gelu(convolution((norm(x) * keep).transpose(1, 2)).transpose(1, 2))
        return self.out(x)

    @torch.no_grad()
    def predict(self, sequence: str) -> torch.Tensor:
        """One (normalised) sequence -> (L, len(BURIAL_TARGETS)) float32 on the network's device."""
        ids = sequence_ids(sequence)[None].to(self.out.weight.device)
        return self(ids, torch.ones_like(ids, dtype=torch.bool))[0].float()


class StructuredChain(Protocol):
    """What `train_burial` reads of a chain (protein.data.ProteinChain, protein.heldout.HeldoutChain)."""

    sequence: str
    coordinates: torch.Tensor  # (L, 5, 3) Å, Cα at index 1


@dataclass(frozen=True)
class BurialTraining:
    """How `train_burial` fits the network: AdamW under a one-cycle schedule, mean squared error."""

    epochs: int = 6
    """Passes over the chains (fold-tiny's: 15,697 chains, 457 s on 2 cores)."""
    residues_per_batch: int = 6000
    """Chains of similar length are batched until their padded residues pass this."""
    learning_rate: float = 2e-3
    """The schedule's peak step size."""
    weight_decay: float = 1e-2
    """AdamW's decoupled weight decay."""
    seed: int = 0
    """Seeds the order of the batches."""

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.residues_per_batch < 1 or self.learning_rate <= 0 or self.weight_decay < 0:
            raise ValueError(f"BurialTraining needs epochs >= 1, residues_per_batch >= 1, learning_rate > 0 and "
                             f"weight_decay >= 0; got {self}")


def _batches(ids: Sequence[torch.Tensor], targets: Sequence[torch.Tensor], residues: int
             ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(input_ids (B, L), mask (B, L), targets (B, L, T)) of chains of similar length, padded, in
    order of length."""
    order = sorted(range(len(ids)), key=lambda k: len(ids[k]))
    groups, current = [], []
    for k in order:
        current.append(k)
        if len(current) * len(ids[k]) >= residues:
            groups.append(current)
            current = []
    groups += [current] if current else []
    batches = []
    for group in groups:
        length = max(len(ids[k]) for k in group)
        input_ids = torch.full((len(group), length), UNKNOWN_ID, dtype=torch.long)
        mask = torch.zeros(len(group), length, dtype=torch.bool)
        padded = torch.zeros(len(group), length, len(BURIAL_TARGETS))
        for row, k in enumerate(group):
            input_ids[row, : len(ids[k])], mask[row, : len(ids[k])], padded[row, : len(ids[k])] = ids[k], True, targets[k]
        batches.append((input_ids, mask, padded))
    return batches


def train_burial(net: BurialNet, chains: Sequence[StructuredChain], training: BurialTraining = BurialTraining()
                 ) -> list[float]:
    """Fit `net` (in place, its parameters made trainable for the fit and frozen after) to the chains'
    neighbour_counts -> the mean squared error of each epoch."""
    if not chains:
        raise ValueError("train_burial needs at least one chain")
    device = net.out.weight.device
    ids = [sequence_ids(chain.sequence) for chain in chains]
    targets = [neighbour_counts(chain.coordinates[:, 1], getattr(chain, "ca_mask", None)) for chain in chains]
    batches = _batches(ids, targets, training.residues_per_batch)  # padded once, shuffled every epoch
    generator = torch.Generator().manual_seed(training.seed)
    with torch.no_grad():  # start from the targets' mean rather than from 0, some 3 below it
        net.out.bias.copy_(torch.cat(targets).mean(0))
    net.requires_grad_(True)
    net.train()
    optimiser = torch.optim.AdamW(net.parameters(), lr=training.learning_rate, weight_decay=training.weight_decay)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, training.learning_rate,
                                                   total_steps=training.epochs * len(batches))
    losses = []
    try:
        with torch.enable_grad():
            for _ in range(training.epochs):
                total = torch.zeros((), device=device)  # summed on the device: no sync per step
                for index in torch.randperm(len(batches), generator=generator).tolist():
                    input_ids, mask, target = batches[index]
                    mask, target = mask.to(device), target.to(device)
                    loss = (net(input_ids.to(device), mask) - target)[mask].square().mean()
                    optimiser.zero_grad()
                    loss.backward()
                    optimiser.step()
                    schedule.step()
                    total += loss.detach()
                losses.append(total.item() / len(batches))
    finally:
        net.requires_grad_(False)
        net.eval()
    return losses
