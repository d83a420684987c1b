"""Structure metrics on known values: identical structures, rigid motions, and a real pair of NMR
models scored by TM-align (tmtools, the authors' C++ code) as the published peer."""

import math

import pytest
import tmtools
import torch

from protein.metrics import gdt_ts, lddt, rmsd, tm_d0, tm_score
from protein.pdb_io import read_chain
from protein.superposition import kabsch, seed_fragments

from geometry import random_rotation, random_walk


def nmr_pair(path, first: int, second: int) -> tuple[torch.Tensor, torch.Tensor, str]:
    a, b = read_chain(path, model=first), read_chain(path, model=second)
    return a.coordinates[:, 1].double(), b.coordinates[:, 1].double(), a.sequence


def test_kabsch_recovers_a_rotation_and_never_reflects():
    points = random_walk(30, 0)
    rotation, shift = random_rotation(1), torch.tensor([3.0, -7.0, 11.0], dtype=torch.float64)
    found, translation = kabsch(points, points @ rotation.T + shift)
    assert torch.allclose(found, rotation, atol=1e-10) and torch.allclose(translation, shift + 0 * translation, atol=1e-9)
    mirrored, _ = kabsch(points, points * torch.tensor([-1.0, 1.0, 1.0], dtype=torch.float64))
    assert torch.det(mirrored).item() == pytest.approx(1.0, abs=1e-12)


def test_identical_and_rigidly_moved_structures_score_perfectly():
    true = random_walk(60, 2)
    moved = true @ random_rotation(3).T + torch.tensor([10.0, 0.0, -4.0], dtype=torch.float64)
    for pred in (true, moved):
        assert rmsd(pred, true).item() < 1e-9
        assert tm_score(pred, true).item() == pytest.approx(1.0, abs=1e-12)
        assert gdt_ts(pred, true).item() == 1.0
        assert lddt(pred, true).item() == 1.0


def test_scores_fall_with_noise_and_lddt_needs_no_superposition():
    true = random_walk(80, 4)
    noise = torch.randn(80, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    scores = [(tm_score(true + s * noise, true).item(), gdt_ts(true + s * noise, true).item(),
               lddt(true + s * noise, true).item()) for s in (0.5, 2.0, 6.0)]
    for better, worse in zip(scores, scores[1:]):
        assert all(b > w for b, w in zip(better, worse))
    per_residue = lddt(true + noise, true, per_residue=True)
    assert per_residue.shape == (80,) and ((per_residue >= 0) & (per_residue <= 1)).all()
    batch = torch.stack([true, true + noise])
    assert torch.allclose(lddt(batch, torch.stack([true, true])), torch.stack([lddt(true, true), lddt(true + noise, true)]))


def test_masked_residues_are_not_scored():
    true = random_walk(40, 6)
    pred = true.clone()
    pred[30:] += 50.0  # far off, but masked out
    mask = torch.arange(40) < 30
    assert tm_score(pred, true, mask).item() == pytest.approx(1.0, abs=1e-12)
    assert lddt(pred, true, mask).item() == 1.0 and rmsd(pred, true, mask).item() < 1e-9


@pytest.mark.parametrize("models", [(0, 5), (0, 17)])
def test_tm_score_of_nmr_models_matches_tm_align(nmr_ensemble, models):
    pred, true, sequence = nmr_pair(nmr_ensemble, *models)
    core = slice(10, None)  # past the floppy FLAG tag, TM-align finds the identity alignment: the same question
    pred, true, sequence = pred[core], true[core], sequence[core]
    aligned = tmtools.tm_align(pred.numpy(), true.numpy(), sequence, sequence)
    assert aligned.seqxA == sequence == aligned.seqyA
    assert tm_score(pred, true).item() == pytest.approx(aligned.tm_norm_chain2, abs=1e-3)
    assert 0.0 < gdt_ts(pred, true).item() < 1.0


def test_d0_and_seed_fragments():
    assert tm_d0(15) == 0.5 and tm_d0(100) == pytest.approx(1.24 * 85 ** (1 / 3) - 1.8)
    seeds = seed_fragments(torch.ones(16, dtype=torch.bool))
    assert {int(s.sum()) for s in seeds} == {16, 8, 4}
    assert all(math.prod(s.nonzero().squeeze(1).diff().tolist()) == 1 for s in seeds)  # contiguous


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="pred and true must both be"):
        tm_score(torch.zeros(5, 3), torch.zeros(6, 3))
    with pytest.raises(ValueError, match="mask must be"):
        lddt(torch.zeros(5, 3), torch.zeros(5, 3), torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="at least 3 residues"):
        tm_score(torch.zeros(5, 3), torch.zeros(5, 3), torch.tensor([1, 1, 0, 0, 0], dtype=torch.bool))
