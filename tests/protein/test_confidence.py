"""The realised fold's confidence (protein.confidence): against a float64 sum over every bin's overlap
with each tolerated interval; for a distogram certain of some distances, the fold's lDDT-Cα against
them; and as `fold`'s pLDDT of the realised trace."""

from __future__ import annotations

import pytest
import torch

from protein.confidence import INCLUSION_RADIUS, distogram_lddt
from protein.data import load_chains
from protein.folding import fold
from protein.losses import distogram_bin_bounds, distogram_bin_centres, distogram_targets
from protein.metrics import LDDT_THRESHOLDS, lddt
from protein.model import FoldingModel
from tests.protein.test_fold_evaluation import TINY
from zoo.parity import relative_error

BINS = 64


def reference_lddt(logits: torch.Tensor, ca: torch.Tensor, temperature: float) -> torch.Tensor:
    """The module docstring's sum, pair by pair and bin by bin in float64."""
    probabilities = (logits.double() / temperature).softmax(-1)
    bounds = distogram_bin_bounds(BINS).tolist()
    distances = torch.cdist(ca.double(), ca.double())

    def mass(i: int, j: int, low: float, high: float) -> float:
        return sum(probabilities[i, j, k].item() * max(0.0, min(high, bounds[k + 1]) - max(low, bounds[k]))
                   / (bounds[k + 1] - bounds[k]) for k in range(BINS))

    out = []
    for i in range(len(ca)):
        others = [j for j in range(len(ca)) if j != i]
        near = sum(mass(i, j, -1e9, INCLUSION_RADIUS) for j in others)
        preserved = sum(mass(i, j, distances[i, j].item() - t, min(distances[i, j].item() + t, INCLUSION_RADIUS))
                        for j in others for t in LDDT_THRESHOLDS) / len(LDDT_THRESHOLDS)
        out.append(preserved / near)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_matches_the_bin_by_bin_sum_in_float64(temperature):
    generator = torch.Generator().manual_seed(0)
    ca = torch.randn(7, 3, generator=generator, dtype=torch.float64) * 6.0  # distances from ~1 to ~25 Å
    logits = torch.randn(7, 7, BINS, generator=generator) * 3.0
    ours = distogram_lddt(logits, ca, temperature)
    assert ours.dtype == torch.float32
    assert relative_error(ours, reference_lddt(logits, ca, temperature)) < 1e-6
    assert torch.equal(ours, distogram_lddt(logits, ca, temperature, rows=3))


@pytest.mark.parametrize("scale", [1.0, 1.2, 1.5])
def test_a_certain_distogram_gives_the_lddt_of_the_fold_against_its_distances(scale):
    """All the mass in the bin of the distances of `scale` x a real chain: the confidence of the
    chain itself is its lDDT-Cα against that scaled chain, up to the bins' width (0.31 Å)."""
    ca = load_chains("test")[0].coordinates[:, 1]
    certain = torch.nn.functional.one_hot(distogram_targets(ca[None] * scale, BINS)[0], BINS).float() * 60.0
    expected = lddt(ca, ca * scale, per_residue=True)
    confidence = distogram_lddt(certain, ca)
    assert (confidence - expected).abs().max() < 0.05 and (confidence - expected).abs().mean() < 0.015
    assert expected.mean() > 0.99 if scale == 1.0 else expected.mean() < 0.5


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match=r"distogram_lddt needs logits \(L, L, bins\) and ca \(L, 3\); got \(4, 4, 64\) "
                                         r"and \(5, 3\)"):
        distogram_lddt(torch.zeros(4, 4, BINS), torch.zeros(5, 3))
    with pytest.raises(ValueError, match="temperature must be > 0; got 0"):
        distogram_lddt(torch.zeros(4, 4, BINS), torch.zeros(4, 3), temperature=0)


def test_fold_reports_the_realised_traces_confidence_and_keeps_the_heads():
    torch.manual_seed(0)
    model = FoldingModel(TINY).eval()
    logits = {}
    model.register_forward_hook(lambda _m, _i, out: logits.__setitem__("distogram", out["distogram_logits"][0]))
    sequence = "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ"
    realised = fold(model, sequence)
    assert torch.allclose(realised.plddt, distogram_lddt(logits["distogram"], realised.backbone[:, 1]), atol=1e-5)
    module = fold(model, sequence, realisation=None)
    assert torch.equal(module.plddt, module.module_plddt) and torch.equal(realised.module_plddt, module.module_plddt)
    assert not torch.equal(realised.plddt, realised.module_plddt)


def test_the_bins_bounds_hold_their_targets_and_centres() -> None:
    """Every distance falls between the bounds of the bin `distogram_targets` gives it (the end bins'
    closed at the inner width, 0.3125 Å for AlphaFold's 64 bins), and each centre is its bin's middle."""
    bounds = distogram_bin_bounds(BINS)
    assert bounds.shape == (BINS + 1,) and bounds.dtype == torch.float64
    assert torch.allclose(bounds[1:] - bounds[:-1], torch.full((BINS,), 0.3125, dtype=torch.float64))
    positions = torch.rand(1, 200, 3, generator=torch.Generator().manual_seed(5)) * 14.0
    targets = distogram_targets(positions, BINS)[0]
    distances = torch.cdist(positions[0].double(), positions[0].double())
    inner = (distances >= bounds[0]) & (distances < bounds[-1])
    assert inner.sum() > 10_000 and targets.unique().numel() > BINS - 4
    assert torch.all(distances[inner] >= bounds[targets[inner]] - 1e-6)
    assert torch.all(distances[inner] < bounds[targets[inner] + 1] + 1e-6)
    centres = distogram_bin_centres(BINS).double()
    assert relative_error(centres, (bounds[1:] + bounds[:-1]) / 2) < 1e-7
    on_a_line = torch.cat([torch.zeros(1), centres.float()])[None, :, None] * torch.tensor([1.0, 0.0, 0.0])
    assert distogram_targets(on_a_line, BINS)[0, 0, 1:].tolist() == list(range(BINS))
