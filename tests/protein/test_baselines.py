"""The trivial structure predictors (protein.baselines): the Cα trace builder against its inverse
and a hand-made dihedral, the geometry measured on the training chains against the textbook
α-helix and β-strand, and the propensity predictor against the best constant guess."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from protein.baselines import (CA_STEP, Propensities, StateGeometry, extended_chain, ideal_helix,
                               propensity_structure, trace_from_angles, virtual_angles)
from protein.residues import AMINO_ACIDS
from protein.secondary_structure import STATES, three_states
from protein.data import load_chains
from protein.metrics import lddt


@pytest.fixture(scope="module")
def geometry_and_propensities() -> tuple[StateGeometry, Propensities]:
    train = load_chains("train")
    return (StateGeometry.measure([(c.coordinates[:, 1], three_states(c.dssp)) for c in train]),
            Propensities.measure([(c.sequence, three_states(c.dssp)) for c in train]))


def test_a_trace_built_from_angles_has_those_angles():
    generator = torch.Generator().manual_seed(0)
    angles = math.radians(80) + math.radians(70) * torch.rand(40, generator=generator, dtype=torch.float64)
    dihedrals = math.pi * (2 * torch.rand(39, generator=generator, dtype=torch.float64) - 1)
    trace = trace_from_angles(angles, dihedrals)
    assert trace.shape == (42, 3) and trace.dtype == torch.float64
    assert torch.allclose((trace[1:] - trace[:-1]).norm(dim=-1), torch.full((41,), CA_STEP, dtype=torch.float64),
                          atol=1e-12)
    measured_angles, measured_dihedrals = virtual_angles(trace)
    assert (measured_angles - angles).abs().max() < 1e-10
    assert (torch.remainder(measured_dihedrals - dihedrals + math.pi, 2 * math.pi) - math.pi).abs().max() < 1e-10


@pytest.mark.parametrize("degrees", [-150.0, -50.0, 0.0, 50.0, 170.0])
def test_dihedral_sign_follows_iupac(degrees):
    """a = (1, 0, 0), b = 0, c = (0, 0, 1), d = (cos φ, sin φ, 1): the dihedral a-b-c-d is φ."""
    phi = math.radians(degrees)
    points = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0], [math.cos(phi), math.sin(phi), 1.0]],
                          dtype=torch.float64)
    assert virtual_angles(points)[1].item() == pytest.approx(phi, abs=1e-12)


def test_the_measured_geometry_is_the_textbook_helix_and_strand(geometry_and_propensities):
    """Cα virtual bond angle and dihedral: α-helix about 91° and +50° (right-handed), β-strand
    about 120-125° and -170 to -160°; an ideal helix puts Cα i and i+3 5.0-5.4 Å apart, i and i+4 6.2 Å."""
    geometry, _ = geometry_and_propensities
    degrees = {state: (math.degrees(geometry.angle[state]), math.degrees(geometry.dihedral[state])) for state in STATES}
    assert 88 < degrees["H"][0] < 95 and 45 < degrees["H"][1] < 55
    assert 115 < degrees["E"][0] < 128 and -175 < degrees["E"][1] < -155
    helix = ideal_helix(24, geometry).double()
    assert 5.0 < (helix[3:] - helix[:-3]).norm(dim=-1).mean() < 5.4
    assert 6.0 < (helix[4:] - helix[:-4]).norm(dim=-1).mean() < 6.4


def test_propensities_predict_states_better_than_a_constant(geometry_and_propensities):
    """On the validation chains (never measured), three-state accuracy (Q3) above the most common
    state's share by more than 0.1; the folds of the predicted states score above the extended chain."""
    geometry, propensities = geometry_and_propensities
    chains = load_chains("validation")
    truth = [three_states(c.dssp) for c in chains]
    predicted = [propensities.predict(c.sequence) for c in chains]
    correct = sum(sum(a == b for a, b in zip(t, p)) for t, p in zip(truth, predicted))
    residues = sum(len(t) for t in truth)
    every = "".join(truth)
    assert correct / residues > max(every.count(state) for state in STATES) / residues + 0.1
    scores = {name: statistics.mean(lddt(build(c), c.coordinates[:, 1]).item() for c in chains[:30])
              for name, build in (("extended", lambda c: extended_chain(len(c.sequence))),
                                  ("propensity", lambda c: propensity_structure(c.sequence, propensities, geometry)))}
    assert scores["propensity"] > scores["extended"] + 0.05


def test_the_measures_match_a_residue_by_residue_count():
    """Random chains (short ones too) with runs of random states and unknown residue letters: the
    per-state means and the propensity counts against a plain loop over the positions."""
    generator = torch.Generator().manual_seed(1)
    chains = []
    for length in (1, 2, 3, 4, 9, 30, 57, 80):
        runs = torch.randint(0, len(STATES), (length // 4 + 1,), generator=generator).tolist()
        states = "".join(STATES[i] * 4 for i in runs)[:length]
        sequence = "".join("ACDXY"[i] for i in torch.randint(0, 5, (length,), generator=generator).tolist())
        chains.append((torch.randn(length, 3, generator=generator, dtype=torch.float64) * 3, states, sequence))
    angles = {state: [] for state in STATES}
    dihedrals = {state: [] for state in STATES}
    counts = torch.ones(20, 3, dtype=torch.float64)
    for ca, states, sequence in chains:
        bond_angles, torsions = virtual_angles(ca)
        for i in range(1, len(states) - 1):
            if states[i - 1] == states[i] == states[i + 1]:
                angles[states[i]].append(bond_angles[i - 1].item())
        for i in range(1, len(states) - 2):
            if len(set(states[i - 1:i + 3])) == 1:
                dihedrals[states[i]].append(torsions[i - 1].item())
        for residue, state in zip(sequence, states):
            if residue in AMINO_ACIDS:
                counts[AMINO_ACIDS.index(residue), STATES.index(state)] += 1
    geometry = StateGeometry.measure([(ca, states) for ca, states, _ in chains])
    propensities = Propensities.measure([(sequence, states) for _, states, sequence in chains])
    for state in STATES:
        assert geometry.angle[state] == pytest.approx(statistics.fmean(angles[state]), rel=1e-12)
        sines, cosines = (statistics.fmean(f(x) for x in dihedrals[state]) for f in (math.sin, math.cos))
        assert geometry.dihedral[state] == pytest.approx(math.atan2(sines, cosines), rel=1e-12)
    given = counts / counts.sum(1, keepdim=True)
    assert torch.allclose(propensities.scores, (given / (counts.sum(0) / counts.sum())).log(), rtol=1e-12, atol=0)


def test_bad_input_is_named(geometry_and_propensities):
    geometry, _ = geometry_and_propensities
    with pytest.raises(ValueError, match=r"states must be letters of 'HEC'; got \['X'\]"):
        geometry.trace("HHXE")
    with pytest.raises(ValueError, match=r"dihedrals must have 2 values for 3 angles; got 3"):
        trace_from_angles(torch.ones(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"the chains must have runs of every state 'HEC'; none of \['E', 'C'\]"):
        StateGeometry.measure([(ideal_helix(12, geometry), "H" * 12)])
    with pytest.raises(ValueError, match=r"chain 0 has 12 Cα but 11 states"):
        StateGeometry.measure([(ideal_helix(12, geometry), "H" * 11)])
    with pytest.raises(ValueError, match=r"chain 1 has 3 residues but 2 states"):
        Propensities.measure([("AC", "HE"), ("ACD", "HE")])
