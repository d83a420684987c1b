"""Evaluation against the trivial baselines (protein.evaluation) and folding sequences
(protein.fold): scores and pLDDT agreement recomputed independently, chunked inference of long
sequences equal to whole inference, and clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import protein.folding
from protein.baselines import extended_chain
from protein.burial import BurialConfig
from protein.data import load_chains
from protein.evaluation import METRICS, PREDICTORS, baseline_predictors, evaluate_chain, pearson, summary
from protein.evoformer import EvoformerConfig
from protein.folding import MAX_RESIDUES, fold
from protein.metrics import lddt, tm_score
from protein.model import FoldConfig, FoldingModel
from protein.structure_module import StructureConfig

TINY = FoldConfig(evoformer=EvoformerConfig(msa_dim=16, pair_dim=16, blocks=1, msa_heads=2, pair_heads=2, head_dim=8,
                                            outer_product_dim=4, triangle_dim=16),
                  structure=StructureConfig(single_dim=32, layers=2, heads=2, head_dim=8),
                  burial=BurialConfig(width=8, dilations=(1, 2)), max_recycles=1)


@pytest.fixture(scope="module")
def folding() -> FoldingModel:
    torch.manual_seed(0)
    return FoldingModel(TINY).eval()


def test_pearson_matches_numpy():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(500, generator=g)
    y = 0.5 * x + 0.3 * torch.rand(500, generator=g)
    assert pearson(x, y) == pytest.approx(np.corrcoef(x.numpy(), y.numpy())[0, 1], abs=1e-12)
    assert pearson(x, torch.ones(500)) == 0.0


def test_chain_scores_and_summary(folding):
    train, chains = load_chains("train")[:200], load_chains("test")[:3]
    baselines = baseline_predictors(train)
    evaluations = []
    for chain in chains:
        ca = chain.coordinates[:, 1]
        mask = torch.ones(len(chain.sequence), dtype=torch.bool)
        mask[::7] = False  # residues missing from the structure are not scored
        evaluation = evaluate_chain(folding, chain.name, chain.sequence, ca, mask, baselines)
        assert set(evaluation.scores) == set(PREDICTORS) and set(evaluation.scores["model"]) == set(METRICS)
        assert evaluation.scores["extended_chain"]["lddt"] == pytest.approx(
            lddt(extended_chain(len(chain.sequence)), ca, mask).item())
        predicted = fold(folding, chain.sequence)
        assert torch.equal(evaluation.model_ca, predicted.backbone[:, 1])
        assert evaluation.scores["model"]["tm"] == pytest.approx(tm_score(predicted.backbone[:, 1], ca, mask).item())
        assert torch.equal(evaluation.plddt, predicted.plddt[mask]) and evaluation.true_lddt.shape == (int(mask.sum()),)
        assert torch.allclose(evaluation.true_lddt, lddt(predicted.backbone[:, 1], ca, mask, per_residue=True)[mask].float())
        module_ca = predicted.module_backbone[:, 1]
        assert evaluation.scores["structure_module"]["lddt"] == pytest.approx(lddt(module_ca, ca, mask).item())
        assert torch.allclose(evaluation.module_true_lddt, lddt(module_ca, ca, mask, per_residue=True)[mask].float())
        assert torch.equal(evaluation.module_plddt, predicted.module_plddt[mask])
        evaluations.append(evaluation)
    totals = summary(evaluations)
    assert totals["chains"] == 3
    assert totals["ideal_helix_gdt_ts"] == pytest.approx(np.mean([e.scores["ideal_helix"]["gdt_ts"] for e in evaluations]))
    pooled = pearson(torch.cat([e.plddt for e in evaluations]), torch.cat([e.true_lddt for e in evaluations]))
    assert totals["plddt_pearson"] == pooled and -1.0 <= pooled <= 1.0
    assert totals["plddt_pearson_module"] == pearson(torch.cat([e.module_plddt for e in evaluations]),
                                                     torch.cat([e.module_true_lddt for e in evaluations]))
    with pytest.raises(ValueError, match="at least one evaluated chain"):
        summary([])


def test_long_sequences_fold_in_chunks_as_they_would_whole(folding, monkeypatch):
    sequence = "".join("ACDEFGHIKLMNPQRSTVWY"[i] for i in torch.randint(20, (96,), generator=torch.Generator().manual_seed(1)))
    whole = fold(folding, sequence)  # 96 residues fit the default budget: no chunking
    monkeypatch.setattr(protein.folding, "INFERENCE_MEMORY_BUDGET", 64 * 1024)  # a few slices per chunk
    calls = []
    original = protein.chunking.chunked
    monkeypatch.setattr(protein.evoformer, "chunked", lambda f, s, d, size, *a, **k: (calls.append(size),
                                                                                        original(f, s, d, size, *a, **k))[1])
    chunked = fold(folding, sequence)
    assert calls and max(c for c in calls if c is not None) < 96
    assert (chunked.backbone - whole.backbone).abs().max() < 1e-3 and (chunked.plddt - whole.plddt).abs().max() < 1e-4
    assert folding.config.memory_budget is None  # the model's own settings are left as they were


def test_bad_sequences_are_refused(folding):
    with pytest.raises(ValueError, match=f"sequence has {MAX_RESIDUES + 1} residues; at most {MAX_RESIDUES}"):
        fold(folding, "A" * (MAX_RESIDUES + 1))
    with pytest.raises(ValueError, match="sequence must be a non-empty string"):
        fold(folding, "")
    with pytest.raises(ValueError, match="sequence has '#' at position 1"):
        fold(folding, "A#")
