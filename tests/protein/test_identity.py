"""Sequence identity (protein.identity): parasail's alignment statistics against Biopython's
aligner with the same scoring, and identities of known relationships."""

from __future__ import annotations

import random

import pytest
from Bio import Align
from Bio.Align import substitution_matrices

from protein.data import load_chains
from protein.identity import GAP_EXTEND, GAP_OPEN, SimilaritySearch, identity_matrix, remove_similar, sequence_identity
from protein.residues import AMINO_ACIDS


@pytest.fixture(scope="module")
def sequences() -> list[str]:
    return [chain.sequence for chain in load_chains("validation")[:12]]


def mutated(sequence: str, fraction: float, rng: random.Random) -> str:
    """sequence with `fraction` of its positions changed to another amino acid."""
    letters = list(sequence)
    for position in rng.sample(range(len(letters)), round(fraction * len(letters))):
        letters[position] = rng.choice(AMINO_ACIDS.replace(letters[position], ""))
    return "".join(letters)


def test_identities_match_biopython_local_alignment(sequences):
    aligner = Align.PairwiseAligner(mode="local", substitution_matrix=substitution_matrices.load("BLOSUM62"),
                                    open_gap_score=-GAP_OPEN, extend_gap_score=-GAP_EXTEND)
    rng = random.Random(0)
    pairs = [(sequences[0], mutated(sequences[0], 0.6, rng)), (sequences[1], sequences[1][20:90])]
    pairs += [(a, b) for a, b in zip(sequences[2:], sequences[3:])]
    for first, second in pairs:
        alignment = aligner.align(first, second)[0]
        expected = alignment.counts().identities / min(len(first), len(second))
        # Equal-scoring alignments may differ in identities; the best score is the same, so stay close.
        assert sequence_identity(first, second) == pytest.approx(expected, abs=0.02)


def test_known_relationships(sequences):
    rng = random.Random(1)
    query = sequences[0]
    assert sequence_identity(query, query) == 1.0
    assert sequence_identity(query[10:60], query) == 1.0  # a fragment lies inside its chain
    assert sequence_identity(query, mutated(query, 0.3, rng)) == pytest.approx(0.7, abs=0.03)
    shuffled = "".join(rng.sample(query, len(query)))
    assert sequence_identity(query, shuffled) < 0.2
    matrix = identity_matrix(sequences[:3], sequences[:4])
    assert matrix.shape == (3, 4) and all(matrix[i, i] == 1.0 for i in range(3))


def test_remove_similar_keeps_the_dissimilar(sequences):
    rng = random.Random(2)
    queries = [mutated(sequences[0], 0.5, rng), mutated(sequences[1], 0.9, rng), sequences[2][5:80]]
    kept, identities = remove_similar(queries, sequences[:3])
    assert kept == [1] and identities[0] >= 0.3 and identities[1] < 0.3 and identities[2] == 1.0
    assert remove_similar(queries, [])[0] == [0, 1, 2]
    with pytest.raises(ValueError, match="threshold must be in"):
        remove_similar(queries, sequences, threshold=0.0)
    with pytest.raises(ValueError, match="queries must be a non-empty"):
        identity_matrix([""], sequences)


def test_the_similarity_search_decides_as_the_full_matrix(sequences):
    """Queries related to a reference at several identities, fragments and unrelated ones: the
    search's answer is the full identity matrix's at the threshold."""
    rng = random.Random(3)
    references = sequences[:8]
    queries = [mutated(references[i], fraction, rng) for i, fraction in ((0, 0.2), (3, 0.6), (5, 0.75), (7, 0.95))]
    queries += [references[2][10:40], sequences[9], sequences[10], "".join(rng.sample(sequences[11], 60))]
    for threshold in (0.3, 0.5):
        search = SimilaritySearch(references, threshold)
        expected = identity_matrix(queries, references).max(1) >= threshold
        assert [search.similar(query) for query in queries] == expected.tolist()
    assert SimilaritySearch(references).similar(queries[0]) and not SimilaritySearch([]).similar(queries[0])
    with pytest.raises(ValueError, match="threshold must be in"):
        SimilaritySearch(references, threshold=1.5)
    with pytest.raises(ValueError, match="query must be a non-empty"):
        SimilaritySearch(references).similar("")
