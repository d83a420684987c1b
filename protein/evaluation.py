"""Scoring a folding model against the trivial baselines on chains it never saw.

Every chain is folded from its sequence alone (no profile: what `zoo fold SEQUENCE` does) and
scored on its Cα atoms present in the experimental structure with lDDT-Cα, TM-score and GDT-TS
(`protein.metrics`): the fold realised from the distogram ("model"), the structure module's own
backbone ("structure_module"), and the three trivial predictors of `protein.baselines`, whose
geometry and propensities are measured on the model's training chains. Each fold's pLDDT is kept
per residue with its true per-residue lDDT-Cα (the realised fold's from the model's confidence
readout, `protein.confidence_readout`; the structure module's from the pLDDT head), so their
agreement (Pearson's r) can be computed over all residues of all chains.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from protein.baselines import Propensities, StateGeometry, extended_chain, ideal_helix, propensity_structure
from protein.data import ProteinChain
from protein.folding import fold
from protein.metrics import gdt_ts, lddt, tm_score
from protein.model import FoldingModel
from protein.secondary_structure import three_states

METRICS = {"lddt": lddt, "tm": tm_score, "gdt_ts": gdt_ts}
"""Metric name -> function(pred (N, 3), true (N, 3), mask (N,)) -> 0-d tensor."""
BASELINES = ("extended_chain", "ideal_helix", "propensity_states")
"""The trivial predictors, in the order tables show them."""
PREDICTORS = ("model", "structure_module", *BASELINES)
"""Everything scored, in the order tables show it: the realised fold, the structure module's, the baselines."""

Predictor = Callable[[str], torch.Tensor]
"""sequence -> predicted Cα (L, 3)."""


@dataclass
class ChainEvaluation:
    """The scores of one chain."""

    name: str
    """The chain's name (source/file:chain for held-out chains)."""
    length: int
    """Residues of the sequence."""
    scores: dict[str, dict[str, float]]
    """Predictor ("model", "structure_module" and BASELINES) -> metric (METRICS) -> score in [0, 1]."""
    model_ca: torch.Tensor
    """(L, 3) the model's Cα, Å."""
    plddt: torch.Tensor
    """(N,) the model's pLDDT of its fold at the residues with a Cα in the structure, in [0, 1]."""
    true_lddt: torch.Tensor
    """(N,) the per-residue lDDT-Cα of the model's fold at the same residues."""
    module_plddt: torch.Tensor
    """(N,) the pLDDT head's estimate for the structure module's own backbone, the fold it was trained on."""
    module_true_lddt: torch.Tensor
    """(N,) the per-residue lDDT-Cα of that backbone."""


def baseline_predictors(training_chains: Iterable[ProteinChain]) -> dict[str, Predictor]:
    """The trivial predictors, their geometry and propensities measured on `training_chains`."""
    pairs = [(chain.coordinates[:, 1], three_states(chain.dssp), chain.sequence) for chain in training_chains]
    geometry = StateGeometry.measure([(ca, states) for ca, states, _ in pairs])
    propensities = Propensities.measure([(sequence, states) for _, states, sequence in pairs])
    return {"extended_chain": lambda sequence: extended_chain(len(sequence)),
            "ideal_helix": lambda sequence: ideal_helix(len(sequence), geometry),
            "propensity_states": lambda sequence: propensity_structure(sequence, propensities, geometry)}


def evaluate_chain(model: FoldingModel, name: str, sequence: str, ca: torch.Tensor, ca_mask: torch.Tensor,
                   baselines: dict[str, Predictor]) -> ChainEvaluation:
    """Fold `sequence` without a profile and score it and every baseline against the true Cα
    ca (L, 3) Å at the residues of ca_mask (L,) bool."""
    prediction = fold(model, sequence)
    folds = {"model": prediction.backbone[:, 1], "structure_module": prediction.module_backbone[:, 1]}
    folds |= {key: predict(sequence) for key, predict in baselines.items()}
    mask = ca_mask.bool()
    scores = {key: {metric: score(pred.float(), ca.float(), mask).item() for metric, score in METRICS.items()}
              for key, pred in folds.items()}
    per_residue = {key: lddt(folds[key].float(), ca.float(), mask, per_residue=True)[mask].float()
                   for key in ("model", "structure_module")}
    return ChainEvaluation(name, len(sequence), scores, folds["model"], prediction.plddt[mask], per_residue["model"],
                           prediction.module_plddt[mask], per_residue["structure_module"])


def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    """Pearson's correlation of two (N,) series (0.0 when either is constant)."""
    x, y = x.double() - x.double().mean(), y.double() - y.double().mean()
    denominator = (x.norm() * y.norm()).item()
    return (x @ y).item() / denominator if denominator > 0 else 0.0


def summary(evaluations: list[ChainEvaluation]) -> dict[str, float]:
    """Means over chains of every predictor's metrics ("model_lddt", "ideal_helix_tm", ...), the
    pLDDT-vs-lDDT Pearson r over all residues pooled ("plddt_pearson") and its median per chain
    ("plddt_pearson_median_chain"), the pooled r of the pLDDT head against the structure module's
    backbone ("plddt_pearson_module"), and "chains"."""
    if not evaluations:
        raise ValueError("summary needs at least one evaluated chain")
    means = {f"{predictor}_{metric}": statistics.fmean(e.scores[predictor][metric] for e in evaluations)
             for predictor in evaluations[0].scores for metric in METRICS}
    pooled = pearson(torch.cat([e.plddt for e in evaluations]), torch.cat([e.true_lddt for e in evaluations]))
    per_chain = statistics.median(pearson(e.plddt, e.true_lddt) for e in evaluations)
    module = pearson(torch.cat([e.module_plddt for e in evaluations]),
                     torch.cat([e.module_true_lddt for e in evaluations]))
    return means | {"plddt_pearson": pooled, "plddt_pearson_median_chain": per_chain, "plddt_pearson_module": module,
                    "chains": len(evaluations)}
