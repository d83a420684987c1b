"""Realising the Cα trace from the distogram (protein.realisation): expected distances read the
bins at their centres, a compressed and noisy trace fitted to a real chain's distances recovers the
chain (lDDT-Cα, TM-score, the 3.80 Å step), and `fold` moves each residue rigidly with its Cα."""

from __future__ import annotations

import pytest
import torch

from protein.data import load_chains
from protein.folding import fold
from protein.losses import DISTOGRAM_FIRST_EDGE, DISTOGRAM_LAST_EDGE, distogram_targets
from protein.metrics import lddt, tm_score
from protein.model import FoldingModel
from protein.realisation import CA_STEP, RealisationConfig, expected_distances, realise
from tests.protein.test_fold_evaluation import TINY

BINS = 64


def test_expected_distances_of_certain_bins_are_their_centres():
    chain = load_chains("test")[0]
    ca = chain.coordinates[:, 1]
    bins = distogram_targets(ca[None], BINS)[0]
    logits = torch.nn.functional.one_hot(bins, BINS).float() * 60.0  # all the mass in the true bin
    expected = expected_distances(logits, rows=7)
    true = torch.cdist(ca, ca)
    inside = (true > DISTOGRAM_FIRST_EDGE) & (true < DISTOGRAM_LAST_EDGE)
    half_bin = (DISTOGRAM_LAST_EDGE - DISTOGRAM_FIRST_EDGE) / (BINS - 2) / 2
    assert inside.sum() > 1000 and (expected - true)[inside].abs().max() <= half_bin + 1e-4
    assert torch.equal(expected, expected_distances(logits, rows=len(ca)))


def test_a_drawn_in_noisy_trace_fitted_to_true_distances_recovers_the_chain():
    chain = load_chains("test")[1]
    true = chain.coordinates[:, 1].double()
    noise = torch.randn(true.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    start = 0.6 * true + 0.7 * noise  # drawn in, as an under-trained structure module folds
    mask = torch.ones(len(true), dtype=torch.bool)
    realised = realise(start, torch.cdist(true, true))
    steps = (realised[1:] - realised[:-1]).norm(dim=-1)
    assert lddt(start.float(), true.float(), mask) < 0.5
    assert lddt(realised, true.float(), mask) > 0.9 and tm_score(realised, true.float(), mask) > 0.9
    assert steps.mean() == pytest.approx(CA_STEP, abs=0.05)
    mirrored = realise(start * torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64), torch.cdist(true, true))
    assert tm_score(mirrored, true.float(), mask) < 0.5  # distances alone keep the start's handedness


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match=r"realise needs ca \(L, 3\) and expected \(L, L\); got \(5, 3\) and \(4, 4\)"):
        realise(torch.zeros(5, 3), torch.zeros(4, 4))
    with pytest.raises(ValueError, match="RealisationConfig needs steps >= 0"):
        RealisationConfig(steps=-1)
    assert torch.equal(realise(torch.ones(1, 3), torch.zeros(1, 1)), torch.ones(1, 3))


def test_fold_moves_each_residue_with_its_realised_ca():
    torch.manual_seed(0)
    model = FoldingModel(TINY).eval()
    sequence = "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ"
    prediction = fold(model, sequence)
    module = fold(model, sequence, realisation=None)
    assert torch.equal(module.backbone, module.module_backbone)
    assert torch.equal(prediction.module_backbone, module.backbone)
    shift = prediction.backbone - prediction.module_backbone  # (L, 3 atoms, 3)
    assert torch.allclose(shift, shift[:, 1:2].expand_as(shift), atol=1e-5)
    steps = (prediction.backbone[1:, 1] - prediction.backbone[:-1, 1]).norm(dim=-1)
    assert steps.mean() == pytest.approx(CA_STEP, abs=0.1)
