"""A word n-gram language model spelled out in characters, for shallow fusion in the beam search
of a character transducer: a closed lexicon, and a word-level interpolated Kneser-Ney model
(`asr.language_model.NgramLanguageModel` over word ids) factorised into next-character
probabilities through the lexicon's prefix tree.

Given the words a hypothesis has finished (h) and the prefix p of the word it is spelling,
    p(next char c)  = P(p+c... | h) / P(p... | h)          P(p... | h): the word model's mass of the lexicon words
                                                           starting with p (a contiguous run of the sorted lexicon)
    p(space)        = P(p | h) / P(p... | h) x (1 - P(end | h, p))     p itself a word, another word follows
    p(end)          = P(p | h) / P(p... | h) x P(end | h, p)           p itself a word, the sentence ends
so the characters of a sentence multiply to exactly its word-model probability (given that it is
not empty), and a character that leaves the lexicon has probability 0 (log -inf): beam search
spells only lexicon words. Token ids are those of the character tokenizer (`asr.text`).

    lm = WordLanguageModel.train(transcripts, order=4)
    lm.log_probs(TranscriptTokenizer("char").encode("good morrow ma"))    (V,) log p(next character)
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import load_file, save

from asr.language_model import END, KIND, BoundedCache, LanguageModel, NgramLanguageModel
from asr.text import CHARACTERS

SPACE_ID = CHARACTERS.index(" ") + 1
"""Token id of the space (character tokens are 1 + their index in CHARACTERS)."""
VOCAB_SIZE = len(CHARACTERS) + 1
"""Character tokens, the blank included."""


@dataclass(frozen=True)
class _Prefix:
    """A node of the lexicon's prefix tree."""

    first: int
    """Index in the sorted lexicon of the first word starting with the prefix."""
    stop: int
    """One past the last such word."""
    next_ids: np.ndarray
    """(C,) token ids of the characters that continue the prefix within the lexicon."""
    next_first: np.ndarray
    """(C,) `first` of each continued prefix."""
    next_stop: np.ndarray
    """(C,) `stop` of each continued prefix."""
    word: int
    """Word id (1 + lexicon index) if the prefix is itself a word, else 0."""


class WordLanguageModel:
    """A lexicon of words (sorted, distinct) and a word n-gram model over their ids (word i of the
    lexicon has id i + 1; id 0 is the sentence end); next-character log probabilities for fusion."""

    vocab_size = VOCAB_SIZE

    def __init__(self, lexicon: Sequence[str], word_model: NgramLanguageModel) -> None:
        words = list(lexicon)
        if words != sorted(set(words)) or not words:
            raise ValueError("lexicon must be distinct words in sorted order, at least one")
        bad = [w for w in words if not w or set(w) - set(CHARACTERS[1:])]
        if bad:
            raise ValueError(f"lexicon words must be non-empty, of the characters {CHARACTERS[1:]!r}; got {bad[:5]}")
        if word_model.vocab_size != len(words) + 1:
            raise ValueError(f"word_model must have {len(words) + 1} ids (the lexicon and the end); got {word_model.vocab_size}")
        self.lexicon, self.word_model = words, word_model
        self.word_ids = {w: i + 1 for i, w in enumerate(words)}
        self._tree = self._prefix_tree()
        self._cumulative = BoundedCache()  # word history -> (W+1,) cumulative word probabilities
        self._cache = BoundedCache()  # (word history, prefix) -> (V,) next-token log probabilities

    @classmethod
    def train(cls, transcripts: Sequence[str], order: int = 4) -> WordLanguageModel:
        """The lexicon of the normalised `transcripts` and their word `order`-gram model."""
        sentences = [t.split() for t in transcripts]
        lexicon = sorted({w for words in sentences for w in words})
        ids = {w: i + 1 for i, w in enumerate(lexicon)}
        return cls(lexicon, NgramLanguageModel.train([[ids[w] for w in words] for words in sentences if words],
                                                     len(lexicon) + 1, order))

    def _span(self, prefix: str) -> tuple[int, int]:
        """(first, stop) of the sorted lexicon's words that start with `prefix`."""
        return bisect.bisect_left(self.lexicon, prefix), bisect.bisect_left(self.lexicon, prefix + "\x7f")

    def _prefix_tree(self) -> dict[str, _Prefix]:
        prefixes = {w[:k] for w in self.lexicon for k in range(len(w) + 1)}
        tree = {}
        for prefix in prefixes:
            first, stop = self._span(prefix)
            following = sorted({w[len(prefix)] for w in self.lexicon[first:stop] if len(w) > len(prefix)})
            spans = np.array([self._span(prefix + c) for c in following], dtype=np.int64).reshape(-1, 2)
            tree[prefix] = _Prefix(first, stop, np.array([CHARACTERS.index(c) + 1 for c in following], dtype=np.int64),
                                   spans[:, 0], spans[:, 1], self.word_ids.get(prefix, 0))
        return tree

    def log_probs(self, context: Sequence[int]) -> torch.Tensor:
        """(V,) float64 log p(next token | the character tokens `context`); [END] is the sentence end.
        All -inf when `context` has left the lexicon."""
        if any(not 0 < t < VOCAB_SIZE for t in context):
            raise ValueError(f"context must be character token ids 1..{VOCAB_SIZE - 1}; got {list(context)}")
        *finished, prefix = "".join(CHARACTERS[t - 1] for t in context).split(" ")
        history = tuple(self.word_ids.get(w, -1) for w in finished[max(0, len(finished) - self.word_model.order + 1):])
        if -1 in history or prefix not in self._tree or (finished and not all(finished)):
            return torch.full((VOCAB_SIZE,), -torch.inf, dtype=torch.float64)
        return self._cache.get_or_make((history, prefix), lambda: self._next_token_log_probs(history, self._tree[prefix]))

    def _next_token_log_probs(self, history: tuple[int, ...], node: _Prefix) -> torch.Tensor:
        cumulative = self._cumulative_word_probs(history)
        within = cumulative[node.stop] - cumulative[node.first]
        probs = np.zeros(VOCAB_SIZE)
        probs[node.next_ids] = (cumulative[node.next_stop] - cumulative[node.next_first]) / within
        if node.word:
            word = (cumulative[node.word] - cumulative[node.word - 1]) / within
            ends = float(self.word_model.log_probs(history + (node.word,))[END].exp())
            probs[SPACE_ID], probs[END] = word * (1 - ends), word * ends
        with np.errstate(divide="ignore"):
            return torch.from_numpy(np.log(probs))

    def _cumulative_word_probs(self, history: tuple[int, ...]) -> np.ndarray:
        """(W+1,) [0, P(word 1 | h), P(words 1..2 | h), ...]: lexicon runs' masses are differences."""
        def make() -> np.ndarray:
            probs = self.word_model.log_probs(history).exp().numpy()
            return np.concatenate([[0.0], np.cumsum(probs[1:])])

        return self._cumulative.get_or_make(history, make)

    def to_bytes(self) -> bytes:
        """The lexicon and the word model as safetensors (what `load_language_model` reads)."""
        lexicon = np.frombuffer("\n".join(self.lexicon).encode(), dtype=np.uint8)
        return save({**self.word_model.tensors(), "lexicon": lexicon}, metadata={KIND: "word"})

    @classmethod
    def load(cls, path: str | os.PathLike) -> WordLanguageModel:
        tensors = load_file(str(path))
        return cls(tensors.pop("lexicon").tobytes().decode().split("\n"), NgramLanguageModel.from_tensors(tensors))


def load_language_model(path: str | os.PathLike) -> LanguageModel:
    """A language-model file written by `NgramLanguageModel.to_bytes` or `WordLanguageModel.to_bytes`."""
    with safe_open(str(path), "numpy") as file:
        kind = (file.metadata() or {}).get(KIND, "token")
    if kind not in ("token", "word"):
        raise ValueError(f"language model {str(path)!r} has kind {kind!r}; expected 'token' or 'word'")
    return NgramLanguageModel.load(path) if kind == "token" else WordLanguageModel.load(path)
