"""Word and character error rates by Levenshtein alignment of hypotheses to references."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ErrorCounts:
    """Edit operations that turn the references into the hypotheses, summed over utterances."""

    substitutions: int
    deletions: int
    insertions: int
    reference_length: int
    """Words (or characters) in the references."""

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions

    @property
    def rate(self) -> float:
        """errors / reference_length (may exceed 1; 0 for empty references with no insertions)."""
        return self.errors / self.reference_length if self.reference_length else float(self.errors > 0)


def align(reference: Sequence[str], hypothesis: Sequence[str]) -> tuple[int, int, int]:
    """(substitutions, deletions, insertions) of a minimum-edit alignment; among alignments with
    the fewest edits, the one with the most substitutions (the usual scoring convention)."""
    # Each cell holds (edits, -substitutions, substitutions, deletions, insertions) of the best
    # alignment of reference[:i] with hypothesis[:j]; tuples compare in that order.
    previous = [(j, 0, 0, 0, j) for j in range(len(hypothesis) + 1)]
    for i, word in enumerate(reference, 1):
        current = [(i, 0, 0, i, 0)]
        for j, guess in enumerate(hypothesis, 1):
            e, _, s, d, n = previous[j - 1]
            diagonal = (e, -s, s, d, n) if word == guess else (e + 1, -s - 1, s + 1, d, n)
            e, _, s, d, n = previous[j]
            deletion = (e + 1, -s, s, d + 1, n)
            e, _, s, d, n = current[j - 1]
            insertion = (e + 1, -s, s, d, n + 1)
            current.append(min(diagonal, deletion, insertion))
        previous = current
    _, _, substitutions, deletions, insertions = previous[-1]
    return substitutions, deletions, insertions


def error_counts(references: Sequence[str], hypotheses: Sequence[str], unit: Literal["word", "char"] = "word"
                 ) -> ErrorCounts:
    """Summed edit counts of each hypothesis against its reference; "word" splits on white space,
    "char" compares characters with runs of white space made one space."""
    if len(references) != len(hypotheses):
        raise ValueError(f"references and hypotheses must pair up; got {len(references)} and {len(hypotheses)}")
    if unit not in ("word", "char"):
        raise ValueError(f"unit must be 'word' or 'char'; got {unit!r}")
    totals = [0, 0, 0, 0]
    for reference, hypothesis in zip(references, hypotheses):
        ref, hyp = reference.split(), hypothesis.split()
        if unit == "char":
            ref, hyp = list(" ".join(ref)), list(" ".join(hyp))
        for index, count in enumerate((*align(ref, hyp), len(ref))):
            totals[index] += count
    return ErrorCounts(*totals)


def word_error_rate(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """Total word errors / total reference words."""
    return error_counts(references, hypotheses, "word").rate


def char_error_rate(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """Total character errors / total reference characters."""
    return error_counts(references, hypotheses, "char").rate
