"""Trivial structure predictors a folding model has to beat: the extended chain, an ideal α-helix,
and secondary structure placed from sequence propensities with ideal geometry.

Structures here are Cα traces built from internal coordinates: consecutive Cα are 3.8 Å apart,
and each residue's state (DSSP reduced to three: H helix, E strand, C coil) sets the virtual bond
angle Cα(i-1)-Cα(i)-Cα(i+1) and the virtual dihedral Cα(i-1)..Cα(i+2). `StateGeometry.measure`
takes both per state from real chains (the training chains: a baseline learns nothing else), and
`Propensities.measure` takes each residue type's state frequencies from them; the predictor
scores a window of residues around each position (Chou-Fasman's idea, the numbers measured).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from protein.residues import AMINO_ACIDS, sequence_ids
from protein.secondary_structure import STATES, three_state_ids

CA_STEP = 3.8
"""Å between consecutive Cα (trans peptide bonds)."""
WINDOW = 7
"""Residues a propensity prediction looks at, centred on the predicted one."""


def virtual_angles(ca: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(L, 3) Cα -> (bond angles (L-2,) at Cα 1..L-2, dihedrals (L-3,) about Cα 1-2 .. L-3-L-2),
    radians, float64; dihedrals in (-π, π]."""
    ca = ca.double()
    bonds = ca[1:] - ca[:-1]
    first, second = -bonds[:-1], bonds[1:]
    cosine = (first * second).sum(-1) / (first.norm(dim=-1) * second.norm(dim=-1))
    angles = torch.acos(cosine.clamp(-1.0, 1.0))
    b1, b2, b3 = bonds[:-2], bonds[1:-1], bonds[2:]
    n1, n2 = torch.linalg.cross(b1, b2), torch.linalg.cross(b2, b3)
    along = (b2 / b2.norm(dim=-1, keepdim=True) * torch.linalg.cross(n1, n2)).sum(-1)
    dihedrals = torch.atan2(along, (n1 * n2).sum(-1))
    return angles, dihedrals


def trace_from_angles(angles: torch.Tensor, dihedrals: torch.Tensor, step: float = CA_STEP) -> torch.Tensor:
    """The inverse of `virtual_angles`: a Cα trace (L, 3) float64 with bonds of `step` Å, bond
    angles `angles` (L-2,) and dihedrals `dihedrals` (L-3,) in radians (each atom placed from the
    three before it, the natural extension reference frame method)."""
    length = angles.shape[0] + 2
    if dihedrals.shape[0] != max(length - 3, 0):
        raise ValueError(f"dihedrals must have {max(length - 3, 0)} values for {length - 2} angles; "
                         f"got {dihedrals.shape[0]}")
    points = [torch.zeros(3, dtype=torch.float64), torch.tensor([step, 0.0, 0.0], dtype=torch.float64)]
    if length > 2:
        theta = angles[0].item()
        points.append(points[1] + step * torch.tensor([-math.cos(theta), math.sin(theta), 0.0], dtype=torch.float64))
    for index in range(3, length):
        a, b, c = points[-3], points[-2], points[-1]
        theta, tau = angles[index - 2].item(), dihedrals[index - 3].item()
        bc = (c - b) / (c - b).norm()
        normal = torch.linalg.cross(b - a, bc)
        normal = normal / normal.norm()
        frame = torch.stack([bc, torch.linalg.cross(normal, bc), normal], dim=1)
        local = step * torch.tensor([-math.cos(theta), math.sin(theta) * math.cos(tau), math.sin(theta) * math.sin(tau)],
                                    dtype=torch.float64)
        points.append(c + frame @ local)
    return torch.stack(points[:length]) if length >= 2 else torch.zeros(length, 3, dtype=torch.float64)


@dataclass(frozen=True)
class StateGeometry:
    """The Cα virtual bond angle and dihedral (radians) of each secondary-structure state."""

    angle: dict[str, float]
    """State -> bond angle at a Cα of that state."""
    dihedral: dict[str, float]
    """State -> dihedral about the bond from a Cα of that state to the next."""

    @classmethod
    def measure(cls, traces: list[tuple[torch.Tensor, str]]) -> StateGeometry:
        """From real chains, each a Cα trace (L, 3) and its three states (L letters): per state the
        mean bond angle and the circular mean dihedral, over the positions whose residues all have
        that state (helix and strand interiors; coil wherever four coil residues follow each other)."""
        angles_by_state: list[torch.Tensor] = []
        dihedrals_by_state: list[torch.Tensor] = []
        for index, (ca, states) in enumerate(traces):
            if len(states) != len(ca):
                raise ValueError(f"chain {index} has {len(ca)} Cα but {len(states)} states")
            angles, dihedrals = virtual_angles(ca)
            codes = three_state_ids(states)
            same_three = (codes[:-2] == codes[1:-1]) & (codes[1:-1] == codes[2:])  # about Cα 1 .. L-2
            same_four = same_three[:-1] & (codes[2:-1] == codes[3:])  # about the bonds from Cα 1 .. L-3
            angles_by_state.append(torch.stack([angles, codes[1:-1].double()])[:, same_three])
            dihedrals_by_state.append(torch.stack([dihedrals, codes[1:-2].double()])[:, same_four])
        angle_values, angle_states = torch.cat(angles_by_state, 1) if angles_by_state else torch.zeros(2, 0)
        dihedral_values, dihedral_states = torch.cat(dihedrals_by_state, 1) if dihedrals_by_state else torch.zeros(2, 0)
        missing = [state for code, state in enumerate(STATES)
                   if not (angle_states == code).any() or not (dihedral_states == code).any()]
        if missing:
            raise ValueError(f"the chains must have runs of every state {STATES!r}; none of {missing}")
        angle = {state: angle_values[angle_states == code].mean().item() for code, state in enumerate(STATES)}
        dihedral = {}
        for code, state in enumerate(STATES):
            values = dihedral_values[dihedral_states == code]
            dihedral[state] = torch.atan2(values.sin().mean(), values.cos().mean()).item()
        return cls(angle, dihedral)

    def trace(self, states: str) -> torch.Tensor:
        """The Cα trace (L, 3) float32 of a chain with these states (L letters of H / E / C)."""
        codes = three_state_ids(states)
        angles = torch.tensor([self.angle[s] for s in STATES], dtype=torch.float64)[codes[1:-1]]
        dihedrals = torch.tensor([self.dihedral[s] for s in STATES], dtype=torch.float64)[codes[1:-2]]
        return trace_from_angles(angles, dihedrals).float()


@dataclass(frozen=True)
class Propensities:
    """log(P(state | residue type) / P(state)) for each residue type (20 standard ones) and state."""

    scores: torch.Tensor
    """(20, 3) float64, rows in `protein.residues.AMINO_ACIDS` order, columns in `STATES` order."""

    @classmethod
    def measure(cls, chains: list[tuple[str, str]]) -> Propensities:
        """From (sequence, three states) pairs, the sequences read as `protein.residues.sequence_ids`
        reads them (X uncounted); each count starts at one (Laplace)."""
        for index, (sequence, states) in enumerate(chains):
            if len(sequence) != len(states):
                raise ValueError(f"chain {index} has {len(sequence)} residues but {len(states)} states")
        joined = "".join(sequence for sequence, _ in chains)
        residues = sequence_ids(joined) if joined else torch.zeros(0, dtype=torch.long)
        states = three_state_ids("".join(states for _, states in chains))
        known = residues < len(AMINO_ACIDS)  # X and the letters read as X count for no residue type
        pairs = residues[known] * len(STATES) + states[known]
        shape = (len(AMINO_ACIDS), len(STATES))
        counts = 1.0 + torch.bincount(pairs, minlength=shape[0] * shape[1]).double().view(shape)
        given_residue = counts / counts.sum(1, keepdim=True)
        overall = counts.sum(0) / counts.sum()
        return cls((given_residue / overall).log())

    def predict(self, sequence: str) -> str:
        """Three states for `sequence`: at each position the state whose propensity scores, summed
        over the `WINDOW` residues around it (unknown letters score zero), are highest."""
        rows = torch.tensor([AMINO_ACIDS.index(r) if r in AMINO_ACIDS else -1 for r in sequence])
        scores = torch.where((rows >= 0)[:, None], self.scores[rows.clamp_min(0)], 0.0)
        half = WINDOW // 2
        padded = torch.nn.functional.pad(scores.T[None], (half, half))
        summed = torch.nn.functional.conv1d(padded, torch.ones(len(STATES), 1, WINDOW, dtype=torch.float64),
                                            groups=len(STATES))[0].T
        return "".join(STATES[i] for i in summed.argmax(-1).tolist())


def extended_chain(length: int) -> torch.Tensor:
    """(L, 3) Cα of a fully extended chain: 3.8 Å steps along x."""
    return torch.arange(length, dtype=torch.float32)[:, None] * torch.tensor([CA_STEP, 0.0, 0.0])


def ideal_helix(length: int, geometry: StateGeometry) -> torch.Tensor:
    """(L, 3) Cα of one α-helix over the whole chain, with `geometry`'s helix angle and dihedral."""
    return geometry.trace("H" * length)


def propensity_structure(sequence: str, propensities: Propensities, geometry: StateGeometry) -> torch.Tensor:
    """(L, 3) Cα of `sequence` folded as its predicted states with ideal geometry."""
    return geometry.trace(propensities.predict(sequence))
