"""A soft lexicon for open-vocabulary beam search: a word the search finishes outside a list of
known words costs a penalty, but stays possible (a closed lexicon, `asr.word_language_model`, rules
it out).

A subword or character language model scores spellings a few tokens at a time, so beam search still
writes non-words where the acoustics are unsure ("the screen's large" -> "the screen's wars", "camera"
-> "camer"). `LexiconPenalty` wraps the fused language model: when a hypothesis's next token begins a
new word (or ends the sentence) and the word it has been spelling is not in the lexicon, that
token's log probability is lowered by `penalty`. Shallow fusion multiplies it by the language-model
weight, so the search pays lm_weight x penalty per unknown word. The scores are then no longer
normalised: a fusion score, not a distribution.

    words = lexicon_words(training_sentences)        # Debian wamerican's words and the text's
    lm = LexiconPenalty(ngram, tokenizer, words, penalty=15.0)
    transcribe(model, paths, tokenizer, language_model=lm, lm_weight=0.2)
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from asr.language_model import END, BoundedCache, LanguageModel
from asr.text import TranscriptTokenizer, normalize

SYSTEM_WORDS = Path("/usr/share/dict/american-english")
"""Debian `wamerican`'s word list (SCOWL, 104k words with inflections and possessives)."""


def lexicon_words(sentences: Iterable[str], word_list: str | os.PathLike = SYSTEM_WORDS) -> frozenset[str]:
    """The words of normalised `sentences` and of `word_list` (one word a line; kept where
    `asr.text.normalize` leaves the word itself, lower-cased: "Aachen's" -> "aachen's", "café" dropped)."""
    path = Path(word_list)
    if not path.exists():
        raise FileNotFoundError(f"word_list {str(path)!r} does not exist (Debian: apt-get install wamerican)")
    listed = {w.lower() for w in path.read_text(encoding="utf-8").split()}
    words = {w for w in listed if normalize(w) == w}
    for sentence in sentences:
        words.update(sentence.split())
    return frozenset(words)


def read_lexicon(path: str | os.PathLike) -> frozenset[str]:
    """The words of a lexicon file (`lexicon_bytes`'s: one a line)."""
    return frozenset(Path(path).read_text(encoding="utf-8").split())


def lexicon_bytes(words: Iterable[str]) -> bytes:
    """The words sorted, one a line (a model folder's `lexicon.txt`)."""
    return "".join(f"{w}\n" for w in sorted(words)).encode()


class LexiconPenalty:
    """A `LanguageModel`: `base`'s log probabilities, less `penalty` on every token that begins a word
    (and on the sentence end, id END) when the word the context is spelling is not in `words`."""

    def __init__(self, base: LanguageModel, tokenizer: TranscriptTokenizer, words: frozenset[str], penalty: float) -> None:
        if base.vocab_size != tokenizer.vocab_size:
            raise ValueError(f"base and tokenizer must have the same tokens; got vocab_size {base.vocab_size} "
                             f"and {tokenizer.vocab_size}")
        if penalty < 0 or not words:
            raise ValueError(f"penalty must be >= 0 and words not empty; got {penalty} and {len(words)} words")
        self.base, self.tokenizer, self.words, self.penalty = base, tokenizer, words, penalty
        self.vocab_size = base.vocab_size
        starts = tokenizer.word_starts()
        self._word_start = starts.tolist()
        """Per token id, whether it begins a word (a list: `spelling` looks ids up one at a time)."""
        starts[END] = True
        self._penalties = starts.double() * penalty
        """(V,) the penalty on the tokens that finish the word being spelled, 0 elsewhere."""
        self._cache = BoundedCache()

    def spelling(self, context: Sequence[int]) -> str:
        """The word the last tokens of `context` spell, from its last word-starting token on ("" when
        the context ends on a word boundary)."""
        start = next((i for i in range(len(context) - 1, -1, -1) if self._word_start[context[i]]), 0)
        return self.tokenizer.decode(context[start:]).strip()

    def log_probs(self, context: Sequence[int]) -> torch.Tensor:
        """(V,) float64 fusion scores of the next token (see the class docstring)."""
        key = tuple(context)

        def make() -> torch.Tensor:
            scores = self.base.log_probs(key)
            word = self.spelling(key)
            return scores - self._penalties if word and word not in self.words else scores

        return self._cache.get_or_make(key, make)
