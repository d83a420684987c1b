"""Training chains: the shipped subset of the ProMod3 structure database, its split, crops and batches.

`protein/assets/promod3_chains.npz` (made by `protein/export_promod3.py`) holds non-redundant PDB
chains of 30-256 residues, concatenated:
    sequence (R,) uint8 residue ids; coordinates (R, 5, 3) float16 Å (N, CA, C, O, CB; each chain
    centred); profile (R, 20) uint8 HHblits frequencies x 255; dssp (R,) uint8 ASCII states;
    lengths (C,) int32; names (C,) "PDBID.CHAIN".
Splits are decided by a hash of the sequence, so identical sequences never straddle two splits.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from protein.features import msa_features
from protein.residues import AMINO_ACIDS, UNKNOWN, sequence_ids
from protein.secondary_structure import IGNORE_INDEX, state_ids

CHAINS_FILE = Path(__file__).parent / "assets" / "promod3_chains.npz"
Split = Literal["train", "validation", "test"]
SPLIT_PERCENT = {"train": range(0, 90), "validation": range(90, 95), "test": range(95, 100)}
"""Hash buckets (of 100) of each split."""


@dataclass
class ProteinChain:
    """One chain of the shipped set."""

    name: str
    """PDB id and chain, e.g. "1ABC.A"."""
    sequence: str
    """One-letter sequence."""
    coordinates: torch.Tensor
    """(L, 5, 3) float32 Å: N, CA, C, O, CB."""
    profile: torch.Tensor
    """(L, 20) float32 amino-acid frequencies per position (rows sum to about 1)."""
    dssp: str
    """Secondary structure state per residue (DSSP letters)."""

    @property
    def residue_ids(self) -> torch.Tensor:
        """(L,) long ids (AMINO_ACIDS order, 20 = X)."""
        return sequence_ids(self.sequence)


def sequence_split(sequence: str) -> Split:
    """The split a sequence belongs to (by the SHA-1 of the sequence)."""
    bucket = int(hashlib.sha1(sequence.encode()).hexdigest(), 16) % 100
    return next(name for name, buckets in SPLIT_PERCENT.items() if bucket in buckets)  # type: ignore[return-value]


def load_chains(split: Split | None = None, path: Path = CHAINS_FILE) -> list[ProteinChain]:
    """Chains of the shipped set (all, or one split)."""
    if split is not None and split not in SPLIT_PERCENT:
        raise ValueError(f"split must be one of {list(SPLIT_PERCENT)} or None; got {split!r}")
    with np.load(path) as archive:
        data = {key: archive[key] for key in archive.files}  # each archive[key] decompresses anew
    ends = np.cumsum(data["lengths"])
    letters = np.frombuffer((AMINO_ACIDS + UNKNOWN).encode(), dtype=np.uint8)[data["sequence"]].tobytes().decode()
    chains = []
    for name, end, length in zip(data["names"], ends, data["lengths"]):
        rows = slice(int(end - length), int(end))
        sequence = letters[rows]
        if split is not None and sequence_split(sequence) != split:
            continue
        chains.append(ProteinChain(
            name=str(name), sequence=sequence,
            coordinates=torch.from_numpy(data["coordinates"][rows].astype(np.float32)),
            profile=torch.from_numpy(data["profile"][rows].astype(np.float32) / 255.0),
            dssp=data["dssp"][rows].tobytes().decode()))
    return chains


@dataclass
class CropConfig:
    """How training examples are cut and featurised."""

    crop_size: int = 64
    """Longest contiguous window of residues per example."""
    msa_rows: int = 8
    """MSA rows sampled from the profile (the query included)."""
    withhold_profile: float = 0.25
    """Probability that an example has no profile (the model must fold from sequence alone)."""

    def __post_init__(self) -> None:
        if self.crop_size < 8 or self.msa_rows < 1 or not 0.0 <= self.withhold_profile <= 1.0:
            raise ValueError(f"CropConfig needs crop_size >= 8, msa_rows >= 1, withhold_profile in [0, 1]; got {self}")


class FoldingExamples(torch.utils.data.Dataset):
    """Chains as model inputs. In training (`random=True`) each item is a random contiguous crop
    of at most crop_size residues, its MSA rows sampled from the profile, the profile withheld with
    probability withhold_profile, all drawn from torch's default generator (torch.manual_seed
    makes runs repeatable). Otherwise the crop is centred and the profile kept unless
    `with_profile=False`, and the MSA draw is seeded by the index.
    Item: {"input_ids" (L,), "position_ids" (L,), "msa_features" (S, L, MSA_FEATURES), "msa_mask"
    (S, L), "coordinates" (L, 5, 3), "atom_mask" (L, 5), "secondary_structure" (L,) three-state ids, "profile" (L, 20) (the target of the model's profile head
    where the input withholds it)}."""

    def __init__(self, chains: list[ProteinChain], config: CropConfig, random: bool = True, with_profile: bool = True
                 ) -> None:
        if not chains:
            raise ValueError("FoldingExamples needs at least one chain")
        self.chains, self.config, self.random, self.with_profile = chains, config, random, with_profile

    def __len__(self) -> int:
        return len(self.chains)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        chain, config = self.chains[index], self.config
        length = len(chain.sequence)
        size = min(length, config.crop_size)
        if self.random:
            start = int(torch.randint(length - size + 1, ()))
            keep_profile = bool(torch.rand(()) >= config.withhold_profile)
            generator = None
        else:
            start, keep_profile = (length - size) // 2, self.with_profile
            generator = torch.Generator().manual_seed(index)
        rows = slice(start, start + size)
        residues = chain.residue_ids[rows]
        msa, msa_mask = msa_features(residues, chain.profile[rows] if keep_profile else None, config.msa_rows, generator)
        return {"input_ids": residues, "position_ids": torch.arange(start, start + size), "msa_features": msa,
                "msa_mask": msa_mask, "coordinates": chain.coordinates[rows],
                "atom_mask": torch.ones(size, 5, dtype=torch.bool), "secondary_structure": state_ids(chain.dssp[rows]),
                "profile": chain.profile[rows]}


def collate_folding(examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Items -> a batch padded to the longest crop and the most MSA rows, with "attention_mask"
    (B, L) 1 = residue; padded MSA rows and residues have msa_mask 0, padded residues a
    secondary_structure of IGNORE_INDEX."""
    length = max(e["input_ids"].shape[0] for e in examples)
    rows = max(e["msa_features"].shape[0] for e in examples)
    batch: dict[str, list[torch.Tensor]] = {key: [] for key in (*examples[0], "attention_mask")}
    for e in examples:
        pad = length - e["input_ids"].shape[0]
        extra_rows = rows - e["msa_features"].shape[0]
        batch["input_ids"].append(torch.nn.functional.pad(e["input_ids"], (0, pad)))
        batch["position_ids"].append(torch.nn.functional.pad(e["position_ids"], (0, pad)))
        batch["msa_features"].append(torch.nn.functional.pad(e["msa_features"], (0, 0, 0, pad, 0, extra_rows)))
        batch["msa_mask"].append(torch.nn.functional.pad(e["msa_mask"], (0, pad, 0, extra_rows)))
        batch["coordinates"].append(torch.nn.functional.pad(e["coordinates"], (0, 0, 0, 0, 0, pad)))
        batch["atom_mask"].append(torch.nn.functional.pad(e["atom_mask"], (0, 0, 0, pad)))
        batch["secondary_structure"].append(torch.nn.functional.pad(e["secondary_structure"], (0, pad),
                                                                    value=IGNORE_INDEX))
        batch["profile"].append(torch.nn.functional.pad(e["profile"], (0, 0, 0, pad)))
        batch["attention_mask"].append(torch.nn.functional.pad(torch.ones(length - pad), (0, pad)))
    return {key: torch.stack(values) for key, values in batch.items()}
