"""Folding a sequence with a trained model: `protein.fold(model_or_name, sequence)`.

    prediction = protein.fold("fold-tiny", "MKTAYIAKQR...")
    prediction.backbone (L, 3, 3) N/CA/C in Å, prediction.plddt (L,) in [0, 1]
    prediction.write_pdb("out.pdb")          pLDDT x 100 in the B-factor column
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from protein.features import msa_features
from protein.model import FoldingModel
from protein.pdb_io import write_pdb
from protein.residues import normalize_sequence, sequence_ids
from zoo.store import load


@dataclass
class Prediction:
    """A predicted backbone."""

    sequence: str
    """The folded sequence (normalised, one letter per residue)."""
    backbone: torch.Tensor
    """(L, 3, 3) float32 Å: N, CA, C per residue."""
    plddt: torch.Tensor
    """(L,) predicted lDDT-Cα in [0, 1]."""

    def write_pdb(self, path: str | os.PathLike) -> None:
        """Write the backbone as a PDB file, pLDDT x 100 as B-factors."""
        write_pdb(Path(path), self.sequence, self.backbone, b_factors=self.plddt * 100)


@torch.no_grad()
def fold(model: FoldingModel | str | os.PathLike, sequence: str, profile: torch.Tensor | None = None,
         recycles: int | None = None, msa_rows: int = 8) -> Prediction:
    """Predict the backbone of `sequence` (one-letter codes; see protein.residues for what is read).
    profile: (L, 20) amino-acid frequencies when one is known (else the model folds from the
    sequence alone); recycles: None = the model's max_recycles."""
    if recycles is not None and (isinstance(recycles, bool) or not isinstance(recycles, int) or recycles < 0):
        raise ValueError(f"recycles must be an int >= 0 (or None for the model's own); got {recycles!r}")
    folding = model if isinstance(model, FoldingModel) else load(model)
    if not isinstance(folding, FoldingModel):
        raise ValueError(f"model {str(model)!r} is not a folding model; got a {type(folding).__name__}")
    sequence = normalize_sequence(sequence)
    residues = sequence_ids(sequence)
    msa, msa_mask = msa_features(residues, profile, msa_rows, torch.Generator().manual_seed(0))
    device = next(folding.parameters()).device
    folding.eval()
    out = folding(input_ids=residues[None].to(device), attention_mask=torch.ones(1, len(sequence), device=device),
                  position_ids=torch.arange(len(sequence), device=device)[None], msa_features=msa[None].to(device),
                  msa_mask=msa_mask[None].to(device), recycles=recycles)
    return Prediction(sequence, out["backbone"][0].float().cpu(), out["plddt"][0].cpu())
