"""Sequence identity between chains, to keep evaluation chains apart from training chains.

Identity of two sequences: the identical residues of their best local alignment (Smith-Waterman,
BLOSUM62, gap open 11 and extend 1, BLAST's protein defaults) divided by the length of the
shorter sequence, so a short chain that lies inside a long one counts as similar. Alignments run
through parasail's striped SIMD Smith-Waterman with statistics; `tests/protein/test_identity.py`
checks its counts against Biopython's aligner. `SimilaritySearch` answers whether any reference is
similar to a query without aligning every one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

GAP_OPEN, GAP_EXTEND = 11, 1
"""Affine gap penalties (BLOSUM62 units)."""
SIMILAR = 0.3
"""Identity at and above which two chains count as similar (the usual homology line)."""
KMER = 3
"""Residues per word that `SimilaritySearch` ranks the references by."""


def _checked(sequence: str, argument: str) -> str:
    if not isinstance(sequence, str) or not sequence:
        raise ValueError(f"{argument} must be a non-empty one-letter sequence; got {sequence!r}")
    return sequence.upper()


def sequence_identity(first: str, second: str) -> float:
    """Identical residues of the best local alignment of the two sequences over the shorter length, in [0, 1]."""
    import parasail

    first, second = _checked(first, "first"), _checked(second, "second")
    result = parasail.sw_stats_striped_16(first, second, GAP_OPEN, GAP_EXTEND, parasail.blosum62)
    return result.matches / min(len(first), len(second))


def identity_matrix(queries: Sequence[str], references: Sequence[str]) -> np.ndarray:
    """(len(queries), len(references)) float64: `sequence_identity` of every query to every reference."""
    import parasail

    queries = [_checked(q, "queries") for q in queries]
    references = [_checked(r, "references") for r in references]
    lengths = np.array([len(r) for r in references])
    identities = np.zeros((len(queries), len(references)))
    for index, query in enumerate(queries):
        profile = parasail.profile_create_stats_16(query, parasail.blosum62)
        matches = np.array([parasail.sw_stats_striped_profile_16(profile, r, GAP_OPEN, GAP_EXTEND).matches
                            for r in references], dtype=np.float64)
        identities[index] = matches / np.minimum(lengths, len(query))
    return identities


def remove_similar(queries: Sequence[str], references: Sequence[str], threshold: float = SIMILAR
                   ) -> tuple[list[int], np.ndarray]:
    """Indices of the queries less than `threshold` identical to every reference, and every
    query's highest identity to a reference (len(queries),) (0 without references)."""
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1]; got {threshold}")
    matrix = identity_matrix(queries, references)
    identities = matrix.max(1) if matrix.shape[1] else np.zeros(len(queries))
    return [i for i, value in enumerate(identities) if value < threshold], identities


@dataclass
class SimilaritySearch:
    """Whether a query is at least `threshold` identical to any of `references`, answered as
    `remove_similar` would but stopping at the first such reference. The references are aligned
    in order of the `KMER`-residue words they share with the query over the shorter length, so a
    similar one usually comes among the first few; a dissimilar query is still aligned to every
    reference."""

    references: Sequence[str]
    """The sequences to search, one-letter."""
    threshold: float = SIMILAR
    """Identity at and above which a reference counts as similar, in (0, 1]."""
    _holders: dict[str, np.ndarray] = field(init=False, repr=False)
    """Each word -> the indices of the references that hold it."""
    _lengths: np.ndarray = field(init=False, repr=False)
    """(len(references),) each reference's length."""

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1]; got {self.threshold}")
        self.references = [_checked(r, "references") for r in self.references]
        holders: dict[str, list[int]] = {}
        for index, reference in enumerate(self.references):
            for word in _words(reference):
                holders.setdefault(word, []).append(index)
        self._holders = {word: np.array(indices) for word, indices in holders.items()}
        self._lengths = np.array([len(r) for r in self.references])

    def similar(self, query: str) -> bool:
        """Whether some reference is at least `threshold` identical to `query`."""
        import parasail

        query = _checked(query, "query")
        shorter = np.minimum(self._lengths, len(query))
        held = [self._holders[word] for word in _words(query) if word in self._holders]
        shared = (np.bincount(np.concatenate(held), minlength=len(self.references)) if held
                  else np.zeros(len(self.references))) / shorter
        profile = parasail.profile_create_stats_16(query, parasail.blosum62)
        for index in np.argsort(-shared, kind="stable"):
            alignment = parasail.sw_stats_striped_profile_16(profile, self.references[index], GAP_OPEN, GAP_EXTEND)
            if alignment.matches / shorter[index] >= self.threshold:
                return True
        return False


def _words(sequence: str) -> set[str]:
    return {sequence[i:i + KMER] for i in range(len(sequence) - KMER + 1)}
