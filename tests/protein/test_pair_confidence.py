"""The per-pair confidence network (protein.pair_confidence): its inputs against a pair-by-pair
float64 reference, its targets against lDDT-Cα itself, its pooling per residue, and its training, judged on
folds it never saw. (What it adds to the readout on real folds: protein.fit_confidence's test and
benchmarks/fold_heldout.py.)"""

from __future__ import annotations

import math

import pytest
import torch

from protein.burial import BURIAL_TARGETS, neighbour_counts
from protein.confidence import pair_terms
from protein.data import ProteinChain, load_chains
from protein.losses import distogram_bin_centres
from protein.metrics import lddt
from protein.pair_confidence import (PAIR_GROUPS, PAIR_INPUTS, PAIR_NUMBERS, REALISED_EDGES, RESIDUE_FEATURES,
                                     SEPARATION_EDGES, PairConfidence, PairTraining, pair_examples, pair_inputs,
                                     pair_targets, separations, train_pair_confidence)
from zoo.parity import relative_error

BINS = 64
LENGTH = 11


def random_fold(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits (LENGTH, LENGTH, BINS), ca (LENGTH, 3) with distances of ~2 to ~40 Å, burial (LENGTH, 4))."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(LENGTH, LENGTH, BINS, generator=generator) * 3.0,
            torch.randn(LENGTH, 3, generator=generator, dtype=torch.float64) * 9.0,
            torch.rand(LENGTH, len(BURIAL_TARGETS), generator=generator) * 4.0)


def test_inputs_match_a_pair_by_pair_reference_in_float64():
    logits, ca, burial = random_fold(0)
    distances = torch.cdist(ca, ca)
    context = (LENGTH, LENGTH, len(BURIAL_TARGETS))
    ours = pair_inputs(logits, distances, separations(slice(0, LENGTH), LENGTH), burial[:, None].expand(context),
                       burial[None].expand(context))
    assert ours.shape == (LENGTH, LENGTH, PAIR_INPUTS) and ours.dtype == torch.float32
    width = BINS // PAIR_GROUPS
    for i in range(LENGTH):
        for j in range(LENGTH):
            p = logits[i, j].double().softmax(-1)
            d, s = distances[i, j].item(), abs(i - j)
            preserved, near = pair_terms(p, distances[i, j])
            sharp_preserved, sharp_near = pair_terms((logits[i, j].double() / 0.7).softmax(-1), distances[i, j])
            expected = [p[g * width : (g + 1) * width].sum().item() for g in range(PAIR_GROUPS)]
            expected += [float(k == sum(min(d, 40.0) > e for e in REALISED_EDGES)) for k in range(len(REALISED_EDGES) + 1)]
            expected += [float(k == sum(s >= e for e in SEPARATION_EDGES)) for k in range(len(SEPARATION_EDGES) + 1)]
            expected += burial[i].tolist() + burial[j].tolist()
            expected += [min(d, 40.0) / 20, preserved.item(), near.item(), sharp_preserved.item(), sharp_near.item(),
                         math.log1p(s) / 5, -sum(q * math.log(q) for q in p.tolist() if q > 0)]
            assert relative_error(ours[i, j], torch.tensor(expected, dtype=torch.float64)) < 1e-5, (i, j)
    rows = (2, LENGTH, len(BURIAL_TARGETS))
    with pytest.raises(ValueError, match=r"pair_inputs needs logits \(R, L, bins\) with bins a multiple of 16, .* got "
                                         r"\(2, 11, 60\), \(2, 11\), \(2, 11\), \(2, 11, 4\), \(2, 11, 4\)"):
        pair_inputs(logits[:2, :, :60], distances[:2], separations(slice(0, 2), LENGTH), burial[:2, None].expand(rows),
                    burial[None].expand(rows))
    with pytest.raises(ValueError, match=r"pair_inputs needs .* got .*, \(2, 11, 4\), \(2, 11, 3\)"):
        pair_inputs(logits[:2], distances[:2], separations(slice(0, 2), LENGTH), burial[:2, None].expand(rows),
                    burial[None, :, :3].expand(2, LENGTH, 3))


def test_the_targets_are_the_terms_lddt_sums():
    generator = torch.Generator().manual_seed(1)
    true = torch.randn(40, 3, generator=generator) * 8.0
    realised = true + torch.randn(40, 3, generator=generator) * 1.5
    targets = pair_targets(realised, true)
    contact, preserved = targets.double().unbind(-1)
    assert contact.diagonal().eq(0).all() and (preserved <= contact).all() and contact.sum() > 100
    assert relative_error(preserved.sum(-1) / contact.sum(-1).clamp_min(1), lddt(realised, true, per_residue=True)) < 1e-6


def test_residue_features_pool_the_network_over_every_other_residue():
    logits, ca, burial = random_fold(2)
    torch.manual_seed(0)
    net = PairConfidence()
    with torch.no_grad():
        net.mean.normal_()
        net.scale.uniform_(0.5, 2.0)
    ours = net.residue_features(logits, ca, burial)
    assert ours.shape == (LENGTH, len(RESIDUE_FEATURES))
    assert torch.equal(ours, net.residue_features(logits, ca, burial, rows=3))
    context = (LENGTH, LENGTH, len(BURIAL_TARGETS))
    with torch.no_grad():
        probabilities = net(pair_inputs(logits, torch.cdist(ca, ca), separations(slice(0, LENGTH), LENGTH),
                                        burial[:, None].expand(context), burial[None].expand(context))).sigmoid()
    probabilities = probabilities.double() * (1 - torch.eye(LENGTH, dtype=torch.float64))[..., None]
    contact, preserved = probabilities.sum(1).unbind(-1)
    expected = torch.stack([preserved / contact, contact.log1p(), preserved.log1p()], -1)
    assert relative_error(ours, expected) < 1e-5
    with pytest.raises(ValueError, match=r"residue_features needs logits \(L, L, bins\), ca \(L, 3\) and burial "
                                         r"\(L, 4\); got \(11, 11, 64\), \(10, 3\) and \(11, 4\)"):
        net.residue_features(logits, ca[:10], burial)


def miscalibrated_fold(chain: ProteinChain, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A real chain's true Cα with a fold and a distogram that know it imperfectly: (logits (L, L,
    BINS) a Gaussian of 3 Å about 1.3 times the true distance, the realised Cα: true plus 1.5 Å noise)."""
    true = chain.coordinates[:, 1].double()
    centres = distogram_bin_centres(BINS).double()
    logits = -(centres - 1.3 * torch.cdist(true, true)[..., None]).square() / (2 * 3.0**2)
    return logits.float(), true + torch.randn(true.shape, generator=generator, dtype=torch.float64) * 1.5


def test_trained_on_folds_it_learns_what_their_distogram_gets_wrong():
    """Folds of eight real chains whose distogram says every distance is 1.3 times the true one:
    trained on the pairs of six, the network's two probabilities must each score the pairs of the
    other two far better (binary cross-entropy) than the distogram's own (pair_terms at temperature
    1: P(D < 15 Å) and the lDDT term expected under it)."""
    generator = torch.Generator().manual_seed(0)
    examples = []
    for chain in load_chains("validation")[:8]:
        logits, realised = miscalibrated_fold(chain, generator)
        examples.append(pair_examples(logits, realised.float(), chain.coordinates[:, 1],
                                      neighbour_counts(chain.coordinates[:, 1]), 3000, generator))
    net = PairConfidence()
    losses = train_pair_confidence(net, examples[:6], PairTraining(epochs=6, batch=1024))
    assert losses[-1] < 0.8 * losses[0] and not any(p.requires_grad for p in net.parameters()) and not net.training
    inputs, targets = torch.cat([x for x, _ in examples[6:]]), torch.cat([y for _, y in examples[6:]])
    with torch.no_grad():
        ours = torch.nn.functional.binary_cross_entropy_with_logits(net(inputs), targets, reduction="none").mean(0)
    first = PAIR_INPUTS - len(PAIR_NUMBERS)
    near, preserved = first + PAIR_NUMBERS.index("near"), first + PAIR_NUMBERS.index("preserved")
    distogram = inputs[:, [near, preserved]].clamp(1e-6, 1 - 1e-6)
    theirs = torch.nn.functional.binary_cross_entropy(distogram, targets, reduction="none").mean(0)
    assert (ours < 0.7 * theirs).all(), (ours, theirs)
    with pytest.raises(ValueError, match="train_pair_confidence needs at least one fold's examples"):
        train_pair_confidence(net, [])
