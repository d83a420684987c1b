"""The sequence-only burial network (protein.burial): its targets against a pair-by-pair float64
count, its batching, the fit on real chains, and a folding model that holds it frozen."""

from __future__ import annotations

import math

import pytest
import torch

from protein.burial import BURIAL_TARGETS, BurialConfig, BurialNet, BurialTraining, neighbour_counts, train_burial
from protein.data import load_chains
from protein.evaluation import pearson
from protein.model import FoldingModel
from protein.residues import sequence_ids
from tests.protein.test_fold_evaluation import TINY


def test_neighbour_counts_match_a_pair_by_pair_count():
    generator = torch.Generator().manual_seed(0)
    ca = torch.randn(20, 3, generator=generator, dtype=torch.float64) * 9.0
    present = torch.rand(20, generator=generator) > 0.2
    ours = neighbour_counts(ca, present)
    assert ours.shape == (20, len(BURIAL_TARGETS)) and ours.dtype == torch.float32
    for i in range(20):
        for k, (radius, separation) in enumerate([(15, 1), (15, 6), (10, 1), (10, 6)]):
            count = sum(1 for j in range(20) if present[i] and present[j] and abs(i - j) >= separation
                        and (ca[i] - ca[j]).norm().item() < radius)
            assert ours[i, k].item() == pytest.approx(math.log1p(count), abs=1e-6), (i, BURIAL_TARGETS[k])
    assert ours[:, 0].max() > ours[:, 3].max() > 0  # the shells are not empty
    with pytest.raises(ValueError, match=r"ca must be \(L, 3\); got \(20, 2\)"):
        neighbour_counts(ca[:, :2])


def test_a_chain_is_predicted_alike_alone_and_padded_in_a_batch():
    torch.manual_seed(0)
    net = BurialNet(BurialConfig(width=16, dilations=(1, 4), kernel_size=5)).eval()
    short, long = "MKTAYIAKQRQISFV", "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ"
    ids = torch.full((2, len(long)), 20, dtype=torch.long)
    ids[0, : len(short)], ids[1] = sequence_ids(short), sequence_ids(long)
    mask = torch.arange(len(long))[None] < torch.tensor([[len(short)], [len(long)]])
    with torch.no_grad():
        batch = net(ids, mask)
    assert batch.shape == (2, len(long), len(BURIAL_TARGETS))
    torch.testing.assert_close(batch[0, : len(short)], net.predict(short), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(batch[1], net.predict(long), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"BurialNet needs input_ids and mask \(B, L\); got \(2, 33\) and \(2, 32\)"):
        net(ids, mask[:, 1:])
    for bad in (dict(width=0), dict(kernel_size=4), dict(dilations=())):
        with pytest.raises(ValueError, match="BurialConfig needs"):
            BurialConfig(**bad)
    with pytest.raises(ValueError, match="BurialTraining needs"):
        BurialTraining(epochs=0)


@pytest.mark.timeout(300)
def test_training_on_real_chains_predicts_burial_on_chains_it_never_saw():
    train, validation = load_chains("train")[:600], load_chains("validation")[:20]
    torch.manual_seed(0)
    net = BurialNet(BurialConfig(width=32, dilations=(1, 2, 4, 8))).requires_grad_(False)
    true = torch.cat([neighbour_counts(chain.coordinates[:, 1])[:, 0] for chain in validation])
    before = pearson(torch.cat([net.predict(chain.sequence)[:, 0] for chain in validation]), true)
    losses = train_burial(net, train, BurialTraining(epochs=6, residues_per_batch=3000,
                                                                    learning_rate=5e-3))
    after = pearson(torch.cat([net.predict(chain.sequence)[:, 0] for chain in validation]), true)
    assert len(losses) == 6 and losses[-1] < 0.7 * losses[0]
    assert after > 0.4 and after > before + 0.3, (before, after)
    assert not any(p.requires_grad for p in net.parameters()) and not net.training


def test_the_folding_model_holds_the_network_frozen_for_the_trainer():
    model = FoldingModel(TINY)
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {f"burial.{name}" for name, _ in model.burial.named_parameters()} | \
        {f"confidence_readout.pairs.{name}" for name, _ in model.confidence_readout.pairs.named_parameters()}
    assert "burial" in model.parallel_plan().pipeline.post
