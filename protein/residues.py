"""Amino-acid alphabet: one-letter codes, their ids, and how sequences are read.

Ids 0-19 are the 20 standard amino acids in alphabetical one-letter order, 20 is unknown (X).
Sequences are read case-insensitively; B, Z, J, U and O (ambiguous or rare amino acids) become X;
any other letter, digit or symbol is an error.
"""

from __future__ import annotations

import torch

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
"""The 20 standard amino acids, id = position."""
UNKNOWN = "X"
UNKNOWN_ID = len(AMINO_ACIDS)
"""Id of an unknown or non-standard residue."""
ALPHABET_SIZE = UNKNOWN_ID + 1
"""Residue ids 0..20."""
READ_AS_UNKNOWN = frozenset("BZJUOX")
"""Letters accepted in a sequence and read as X."""
KYTE_DOOLITTLE = dict(A=1.8, R=-4.5, N=-3.5, D=-3.5, C=2.5, Q=-3.5, E=-3.5, G=-0.4, H=-3.2, I=4.5, L=3.8, K=-3.9,
                      M=1.9, F=2.8, P=-1.6, S=-0.8, T=-0.7, W=-0.9, Y=-1.3, V=4.2)
"""Hydropathy of each standard amino acid (Kyte & Doolittle, 1982); X has none (read as 0)."""

_IDS = {letter: i for i, letter in enumerate(AMINO_ACIDS)}


def normalize_sequence(sequence: str) -> str:
    """Upper-case one-letter sequence with B/Z/J/U/O read as X; ValueError naming the first bad character."""
    if not isinstance(sequence, str) or not sequence:
        raise ValueError(f"sequence must be a non-empty string of one-letter amino-acid codes; got {sequence!r}")
    normal = sequence.upper()
    for position, letter in enumerate(normal):
        if letter not in _IDS and letter not in READ_AS_UNKNOWN:
            raise ValueError(f"sequence has {sequence[position]!r} at position {position}: expected one of "
                             f"{AMINO_ACIDS} or {''.join(sorted(READ_AS_UNKNOWN))}")
    return "".join(UNKNOWN if letter in READ_AS_UNKNOWN else letter for letter in normal)


def sequence_ids(sequence: str) -> torch.Tensor:
    """(L,) long residue ids of `sequence` (read by normalize_sequence)."""
    return torch.tensor([_IDS.get(letter, UNKNOWN_ID) for letter in normalize_sequence(sequence)], dtype=torch.long)
