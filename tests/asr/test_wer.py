"""Word and character error rates against hand-counted alignments and a brute-force edit distance."""

from __future__ import annotations

import random

import pytest

from asr.wer import align, char_error_rate, error_counts, word_error_rate


def brute_force_distance(a: list[str], b: list[str]) -> int:
    if not a or not b:
        return len(a) + len(b)
    return min(brute_force_distance(a[1:], b) + 1, brute_force_distance(a, b[1:]) + 1,
               brute_force_distance(a[1:], b[1:]) + (a[0] != b[0]))


def test_hand_counted_alignments():
    assert align("the cat sat".split(), "the cat sat".split()) == (0, 0, 0)
    assert align("the cat sat".split(), "a cat sat down".split()) == (1, 0, 1)
    assert align("the cat sat on the mat".split(), "cat sat on mat".split()) == (0, 2, 0)
    assert align([], ["x"]) == (0, 0, 1) and align(["x"], []) == (0, 1, 0)
    counts = error_counts(["the cat sat", "hello world"], ["a cat sat down", "hello  world"])
    assert (counts.substitutions, counts.deletions, counts.insertions, counts.reference_length) == (1, 0, 1, 5)
    assert word_error_rate(["the cat sat", "hello world"], ["a cat sat down", "hello world"]) == pytest.approx(0.4)
    assert char_error_rate(["abc"], ["abd"]) == pytest.approx(1 / 3)
    assert char_error_rate(["a  b"], ["a b"]) == 0.0  # white space runs count as one space


def test_edit_counts_equal_the_brute_force_distance():
    rng = random.Random(0)
    for _ in range(200):
        a = [rng.choice("abc") for _ in range(rng.randint(0, 6))]
        b = [rng.choice("abc") for _ in range(rng.randint(0, 6))]
        assert sum(align(a, b)) == brute_force_distance(a, b)


def test_unpaired_inputs_are_named():
    with pytest.raises(ValueError, match="references and hypotheses must pair up; got 2 and 1"):
        word_error_rate(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="unit must be 'word' or 'char'"):
        error_counts(["a"], ["a"], unit="phone")


def test_word_and_character_error_rates_equal_jiwer():
    """jiwer (rapidfuzz's Levenshtein) as the reference: the same corpus WER and CER, and the same
    number of edits per utterance (the split into kinds may differ where alignments tie)."""
    import jiwer

    rng = random.Random(7)
    words = ["to", "be", "or", "not", "the", "question", "a", "an"]
    references = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 12))) for _ in range(300)]
    hypotheses = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 12))) for _ in range(300)]
    assert error_counts(references, hypotheses).rate == pytest.approx(jiwer.wer(references, hypotheses), abs=1e-12)
    assert error_counts(references, hypotheses, "char").rate == pytest.approx(jiwer.cer(references, hypotheses), abs=1e-12)
    for reference, hypothesis in zip(references, hypotheses):
        theirs = jiwer.process_words(reference, hypothesis)
        assert error_counts([reference], [hypothesis]).errors == theirs.substitutions + theirs.deletions + theirs.insertions
