"""Folding a sequence with a trained model: `protein.fold(model_or_name, sequence)`.

    prediction = protein.fold("fold-tiny", "MKTAYIAKQR...")
    prediction.backbone (L, 3, 3) N/CA/C in Å, prediction.plddt (L,) in [0, 1]
    prediction.write("out.pdb")              or "out.cif"; pLDDT x 100 in the B-factor column

The Cα trace is then realised from the model's distogram (`protein.realisation`): each residue's N,
CA and C move with its Cα, and the pLDDT is the model's confidence readout of that trace and of
the burial network's prediction from the sequence (`protein.confidence_readout`, `protein.burial`:
fitted on chains never trained on, or else the trace's lDDT-Cα expected under the distogram,
`protein.confidence`). `realisation=None` keeps the structure
module's own backbone and the pLDDT head's estimate for it, which `Prediction.module_backbone` and
`module_plddt` hold either way.

A model without a chunk size or memory budget of its own folds under `INFERENCE_MEMORY_BUDGET`:
short sequences run whole, and a long one is chunked so that no intermediate tensor outgrows the
budget (the triangle attention logits of a 1,000-residue chain would take 16 GB whole).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from protein.features import msa_features
from protein.model import FoldingModel
from protein.pdb_io import write_structure
from protein.realisation import RealisationConfig, expected_distances, realise
from protein.residues import normalize_sequence, sequence_ids
from zoo.store import load

MAX_RESIDUES = 1500
"""Longest sequence folded: time grows with the cube of the length (minutes at this length on 2 cores)."""
INFERENCE_MEMORY_BUDGET = 256 * 2**20
"""Bytes one chunk's largest intermediate may take when folding with a model that sets none."""


@dataclass
class Prediction:
    """A predicted backbone."""

    sequence: str
    """The folded sequence (normalised, one letter per residue)."""
    backbone: torch.Tensor
    """(L, 3, 3) float32 Å: N, CA, C per residue (realised from the distogram unless folded with
    realisation=None)."""
    plddt: torch.Tensor
    """(L,) float32 predicted lDDT-Cα of `backbone` in [0, 1]: realised, the model's confidence readout
    (`protein.confidence_readout`); with realisation=None, module_plddt."""
    module_backbone: torch.Tensor
    """(L, 3, 3) float32 Å: the structure module's own backbone."""
    module_plddt: torch.Tensor
    """(L,) float32 in [0, 1]: the pLDDT head's estimate of module_backbone's lDDT-Cα."""
    distances: torch.Tensor
    """(L, L) float32 Å: the distogram's expected distances (`protein.realisation.expected_distances`)."""
    confidence_features: torch.Tensor | None = None
    """(L, F) float32: what the confidence readout read (`protein.confidence_readout.FEATURES`); None
    with realisation=None."""
    distogram_logits: torch.Tensor | None = None
    """(L, L, bins) float32: the distogram head's logits when folded with keep_logits=True, else None
    (what the confidence fit reads: `protein.fit_confidence`)."""

    def write(self, path: str | os.PathLike) -> None:
        """Write the backbone as PDB (.pdb) or mmCIF (.cif), pLDDT x 100 as B-factors."""
        write_structure(Path(path), self.sequence, self.backbone, b_factors=self.plddt * 100)


def checked_sequence(sequence: str) -> str:
    """The normalised sequence (protein.residues.normalize_sequence), or ValueError when it is
    longer than MAX_RESIDUES."""
    sequence = normalize_sequence(sequence)
    if len(sequence) > MAX_RESIDUES:
        raise ValueError(f"sequence has {len(sequence)} residues; at most {MAX_RESIDUES} are folded (split it into "
                         f"domains)")
    return sequence


def checked_recycles(recycles: int | None) -> None:
    """ValueError unless recycles is None (the model's own) or an int >= 0."""
    if recycles is not None and (isinstance(recycles, bool) or not isinstance(recycles, int) or recycles < 0):
        raise ValueError(f"recycles must be an int >= 0 (or None for the model's own); got {recycles!r}")


@torch.no_grad()
def fold(model: FoldingModel | str | os.PathLike, sequence: str, profile: torch.Tensor | None = None,
         recycles: int | None = None, msa_rows: int = 8,
         realisation: RealisationConfig | None = RealisationConfig(), keep_logits: bool = False) -> Prediction:
    """Predict the backbone of `sequence` (one-letter codes; see protein.residues for what is read;
    at most MAX_RESIDUES). profile: (L, 20) amino-acid frequencies when one is known (else the
    model folds from the sequence alone); recycles: None = the model's max_recycles; realisation:
    how the Cα trace is realised from the distogram (None: the structure module's backbone as it is);
    keep_logits: also return the distogram's logits (L * L * bins floats)."""
    checked_recycles(recycles)
    sequence = checked_sequence(sequence)
    folding = model if isinstance(model, FoldingModel) else load(model)
    if not isinstance(folding, FoldingModel):
        raise ValueError(f"model {str(model)!r} is not a folding model; got a {type(folding).__name__}")
    residues = sequence_ids(sequence)
    msa, msa_mask = msa_features(residues, profile, msa_rows, torch.Generator().manual_seed(0))
    device = next(folding.parameters()).device
    folding.eval()
    config = folding.config
    if config.chunk_size is None and config.memory_budget is None:
        folding.config = dataclasses.replace(config, memory_budget=INFERENCE_MEMORY_BUDGET)
    try:
        out = folding(input_ids=residues[None].to(device), attention_mask=torch.ones(1, len(sequence), device=device),
                      position_ids=torch.arange(len(sequence), device=device)[None],
                      msa_features=msa[None].to(device), msa_mask=msa_mask[None].to(device), recycles=recycles)
    finally:
        folding.config = config
    module_backbone, module_plddt = out["backbone"][0].float().cpu(), out["plddt"][0].float().cpu()
    logits = out["distogram_logits"][0]
    distances = expected_distances(logits).cpu()
    backbone, plddt, features = module_backbone, module_plddt, None
    if realisation is not None:
        ca = module_backbone[:, 1]
        realised = realise(ca, distances, realisation)
        backbone = module_backbone + (realised - ca)[:, None]
        features = folding.confidence_readout.features(logits, realised.to(logits.device), sequence,
                                                       module_plddt.to(logits.device),
                                                       folding.burial.predict(sequence).to(logits.device))
        plddt = folding.confidence_readout(features).cpu()
        features = features.cpu()
    return Prediction(sequence, backbone, plddt, module_backbone, module_plddt, distances, features,
                      logits.float().cpu() if keep_logits else None)
