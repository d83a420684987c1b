"""The soft lexicon: a word finished outside it costs exactly the penalty, on exactly the tokens that
finish it (a new word's first token, or the sentence end), for character and BPE tokens alike."""

from __future__ import annotations

import pytest
import torch

from asr.language_model import END, NgramLanguageModel
from asr.lexicon import LexiconPenalty, lexicon_bytes, lexicon_words, read_lexicon
from asr.text import TranscriptTokenizer

SENTENCES = ["the cat sat on the mat", "a dog ran to the cat", "the mat is red", "camera and storage"] * 3


def wrapped(tokenizer: TranscriptTokenizer, penalty: float) -> tuple[NgramLanguageModel, LexiconPenalty]:
    base = NgramLanguageModel.train([tokenizer.encode(s) for s in SENTENCES], tokenizer.vocab_size, order=3)
    return base, LexiconPenalty(base, tokenizer, frozenset(" ".join(SENTENCES).split()), penalty)


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_a_word_outside_the_lexicon_pays_the_penalty_where_it_ends(kind):
    tokenizer = (TranscriptTokenizer("char") if kind == "char"
                 else TranscriptTokenizer.train_bpe(SENTENCES + ["camer storg"], vocab_size=48))
    base, lm = wrapped(tokenizer, penalty=7.5)
    starts = tokenizer.word_starts()
    assert starts.shape == (tokenizer.vocab_size,) and 0 < int(starts.sum()) < tokenizer.vocab_size
    for text, known in [("the cat", True), ("the camera", True), ("the camer", False), ("the mat storg", False),
                        ("storg", False), ("", True)]:
        context = tokenizer.encode(text)
        assert lm.spelling(context) == (text.split() or [""])[-1]
        difference = base.log_probs(context) - lm.log_probs(context)
        expected = torch.zeros(tokenizer.vocab_size, dtype=torch.float64)
        if not known:  # a new word's first token and the sentence end finish the word being spelled
            expected[starts] = 7.5
            expected[END] = 7.5
        torch.testing.assert_close(difference, expected, rtol=0, atol=1e-12)


def test_a_context_ending_on_a_word_boundary_spells_no_word():
    tokenizer = TranscriptTokenizer("char")
    base, lm = wrapped(tokenizer, penalty=3.0)
    context = tokenizer.encode("the storg ")  # the space was the token that finished "storg"
    assert lm.spelling(context) == "" and torch.equal(lm.log_probs(context), base.log_probs(context))


def test_the_lexicon_reads_a_word_list_and_the_text(tmp_path):
    listed = tmp_path / "words"
    listed.write_text("Aachen's\ncafé\nproduct\nProducts\nrock'n'roll\nx-ray\n")
    words = lexicon_words(["the camer is a word here"], listed)
    assert words == {"aachen's", "product", "products", "rock'n'roll", "the", "camer", "is", "a", "word", "here"}
    (tmp_path / "lexicon.txt").write_bytes(lexicon_bytes(words))
    assert read_lexicon(tmp_path / "lexicon.txt") == words
    assert (tmp_path / "lexicon.txt").read_text().splitlines()[:2] == ["a", "aachen's"]
    with pytest.raises(FileNotFoundError, match="apt-get install wamerican"):
        lexicon_words([], tmp_path / "missing")


def test_bad_arguments_are_named():
    tokenizer = TranscriptTokenizer("char")
    base, _ = wrapped(tokenizer, penalty=1.0)
    with pytest.raises(ValueError, match="penalty must be >= 0 and words not empty; got -1.0 and 1 words"):
        LexiconPenalty(base, tokenizer, frozenset({"a"}), -1.0)
    other = TranscriptTokenizer.train_bpe(SENTENCES, vocab_size=40)
    with pytest.raises(ValueError, match="base and tokenizer must have the same tokens"):
        LexiconPenalty(base, other, frozenset({"a"}), 1.0)
