"""A token n-gram language model (interpolated Kneser-Ney) for shallow fusion in beam search.

Trained on the recipe's training transcripts, in the transducer's own tokens, so a hypothesis's
language-model score is a function of its token ids alone. It knows the spelling of the training
vocabulary and which words follow which; the transducer's stateless decoder sees only its last
`context_size` tokens.

Token ids follow the transducer: 1..V-1 are tokens; id 0 (the blank, never a token of a
transcript) stands for the sentence end in `log_probs`. Contexts shorter than order-1 are padded
with a sentence start.

    lm = NgramLanguageModel.train([tokenizer.encode(t) for t in transcripts], vocab_size=V, order=8)
    lm.log_probs((5, 12, 3))        # (V,) log p(token | context); [0] is log p(end | context)
    folder_file.write_bytes(lm.to_bytes()); NgramLanguageModel.load(folder_file)

KenLM would serve, but its Python package builds C++ from source; the counts here take seconds.
"""

from __future__ import annotations

import os
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from safetensors.numpy import load_file, save

END = 0
"""Id of the sentence end (the blank's id: no transcript holds it)."""
KIND = "kind"
"""Metadata key of a language-model file: "token" (this model) or "word" (`asr.word_language_model`)."""
CACHE_CONTEXTS = 50_000
"""Distributions kept for reuse (V float64 each; cleared when full, so a long-running decoder stays bounded)."""


class BoundedCache(dict):
    """Values computed once per key; emptied when it holds CACHE_CONTEXTS of them."""

    def get_or_make(self, key: Hashable, make: Callable[[], Any]) -> Any:
        if key not in self:
            if len(self) >= CACHE_CONTEXTS:
                self.clear()
            self[key] = make()
        return self[key]


@dataclass
class _OrderTable:
    """The n-grams of one order k, grouped by context (the first k-1 ids)."""

    rows: dict[int, int]
    """Context (as its key in base V+1) -> its row."""
    starts: np.ndarray
    """(contexts,) first index of the row's run in next_ids and discounted."""
    sizes: np.ndarray
    """(contexts,) length of the run: the distinct ids seen after the context."""
    next_ids: np.ndarray
    """(n-grams,) the last id of each n-gram."""
    discounted: np.ndarray
    """(n-grams,) max(count - D, 0) / the context's total count."""
    backoff: np.ndarray
    """(contexts,) D x sizes / the total count: the weight of the next lower order."""


class LanguageModel(Protocol):
    """What shallow fusion needs: next-token log probabilities given a hypothesis's tokens."""

    vocab_size: int

    def log_probs(self, context: Sequence[int]) -> torch.Tensor:
        """(vocab_size,) float64 log p(next | context); [END] is the sentence end (may be -inf)."""


class NgramLanguageModel:
    """Interpolated Kneser-Ney over token ids: the highest order uses raw counts, lower orders
    continuation counts (in how many distinct contexts a suffix follows), except n-grams that
    begin at the sentence start, which keep raw counts; one absolute discount per order,
    D = n1 / (n1 + 2 n2) from its count-of-counts; order 0 is uniform over the V outcomes."""

    def __init__(self, ngrams: np.ndarray, counts: np.ndarray, vocab_size: int) -> None:
        """ngrams: (M, order) int64 distinct n-grams of the padded training text (the start is
        `vocab_size`, the end END); counts: (M,) their raw counts."""
        if ngrams.ndim != 2 or counts.shape != (ngrams.shape[0],):
            raise ValueError(f"ngrams must be (M, order) and counts (M,); got {tuple(ngrams.shape)} and "
                             f"{tuple(counts.shape)}")
        self.ngrams, self.counts, self.vocab_size = ngrams, counts, vocab_size
        self.order, self.start, self.base = ngrams.shape[1], vocab_size, vocab_size + 1
        _check_order(self.order, vocab_size)
        self._tables = [self._order_table(k) for k in range(1, self.order + 1)]
        self._cache = BoundedCache()

    @classmethod
    def train(cls, sentences: Sequence[Sequence[int]], vocab_size: int, order: int = 8) -> NgramLanguageModel:
        """Count the `order`-grams of token-id sentences (ids 1..vocab_size-1)."""
        _check_order(order, vocab_size)
        if not sentences:
            raise ValueError("the language model needs at least one sentence")
        lengths = np.fromiter(map(len, sentences), dtype=np.int64, count=len(sentences))
        ids = np.fromiter((t for sentence in sentences for t in sentence), dtype=np.int64, count=int(lengths.sum()))
        bad = (ids <= 0) | (ids >= vocab_size)
        if bad.any():
            index = int(np.searchsorted(np.cumsum(lengths), np.argmax(bad), side="right"))
            raise ValueError(f"sentence {index} has ids outside 1..{vocab_size - 1}: {list(sentences[index])}")
        # Every sentence padded as start^(order-1) ids END, one after another; its L + 1 windows start
        # at its first L + 1 places (none reaches into the next sentence).
        padded_lengths = lengths + order
        offsets = np.cumsum(padded_lengths) - padded_lengths
        padded = np.full(int(padded_lengths.sum()), vocab_size, dtype=np.int64)
        padded[np.repeat(offsets + order - 1, lengths) + _places(lengths)] = ids
        padded[offsets + padded_lengths - 1] = END
        rows = padded[(np.repeat(offsets, lengths + 1) + _places(lengths + 1))[:, None] + np.arange(order)]
        keys = rows @ ((vocab_size + 1) ** np.arange(order - 1, -1, -1, dtype=np.int64))
        _, first, counts = np.unique(keys, return_index=True, return_counts=True)
        return cls(rows[first], counts.astype(np.int64), vocab_size)

    def _keys(self, rows: np.ndarray) -> np.ndarray:
        """(N, k) ids -> (N,) int64 keys in base V+1, ordered as the rows are lexicographically."""
        return rows @ (self.base ** np.arange(rows.shape[1] - 1, -1, -1, dtype=np.int64))

    def _order_table(self, k: int) -> _OrderTable:
        grams, inverse = np.unique(self._keys(self.ngrams[:, -k:]), return_inverse=True)
        counts = np.bincount(inverse, weights=self.counts, minlength=len(grams))
        if k < self.order:  # continuation counts: distinct ids seen before the k-gram; the suffixes of the
            # distinct (k+1)-grams are exactly `grams`, in the same sorted order
            continuation = np.unique(_distinct(self._keys(self.ngrams[:, -k - 1:])) % self.base**k, return_counts=True)[1]
            counts = np.where(grams // self.base ** (k - 1) == self.start, counts, continuation).astype(np.float64)
        n1, n2 = (counts == 1).sum(), (counts == 2).sum()
        discount = n1 / (n1 + 2 * n2) if n1 + n2 else 0.5
        contexts, starts = np.unique(grams // self.base, return_index=True)  # grams sorted: one run per context
        sizes = np.diff(np.append(starts, len(grams)))
        totals = np.add.reduceat(counts, starts)
        return _OrderTable(dict(zip(contexts.tolist(), range(len(contexts)))), starts, sizes, grams % self.base,
                           np.maximum(counts - discount, 0) / np.repeat(totals, sizes), discount * sizes / totals)

    def log_probs(self, context: Sequence[int]) -> torch.Tensor:
        """(V,) float64 log p(next | the last order-1 ids of `context`); [END] is the sentence end."""
        padded = ([self.start] * (self.order - 1) + list(context))[len(context):] if self.order > 1 else []
        key = tuple(padded)
        return self._cache.get_or_make(key, lambda: self._interpolated(key).log())

    def _interpolated(self, context: tuple[int, ...]) -> torch.Tensor:
        probs = np.full(self.vocab_size, 1.0 / self.vocab_size)
        key = 0  # of the context's last k-1 ids
        for k, table in enumerate(self._tables, start=1):
            if k > 1:
                key += context[-(k - 1)] * self.base ** (k - 2)
            row = table.rows.get(key)
            if row is None:
                break
            run = slice(table.starts[row], table.starts[row] + table.sizes[row])
            probs *= table.backoff[row]
            probs[table.next_ids[run]] += table.discounted[run]
        return torch.from_numpy(probs)

    def tensors(self) -> dict[str, np.ndarray]:
        """The n-grams and counts, compactly typed (what `from_tensors` reads)."""
        return {"ngrams": self.ngrams.astype(np.int16 if self.vocab_size < 2**15 else np.int32),
                "counts": self.counts.astype(np.int32), "vocab_size": np.array([self.vocab_size])}

    @classmethod
    def from_tensors(cls, tensors: dict[str, np.ndarray]) -> NgramLanguageModel:
        return cls(tensors["ngrams"].astype(np.int64), tensors["counts"].astype(np.int64), int(tensors["vocab_size"][0]))

    def to_bytes(self) -> bytes:
        """The model as safetensors (what `load` and `asr.word_language_model.load_language_model` read)."""
        return save(self.tensors(), metadata={KIND: "token"})

    @classmethod
    def load(cls, path: str | os.PathLike) -> NgramLanguageModel:
        return cls.from_tensors(load_file(str(path)))


def _distinct(keys: np.ndarray) -> np.ndarray:
    """The distinct values of `keys`, ascending (by a sort: numpy's hashed `unique` is several times
    slower on millions of int64 keys)."""
    ordered = np.sort(keys)
    return ordered[np.append(True, ordered[1:] != ordered[:-1])]


def _places(lengths: np.ndarray) -> np.ndarray:
    """0 .. n-1 for each n of `lengths`, one run after another: (sum(lengths),)."""
    return np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)


def _check_order(order: int, vocab_size: int) -> None:
    """N-grams are keyed as int64 numbers in base vocab_size + 1 (the start symbol included)."""
    if order < 1:
        raise ValueError(f"order must be >= 1; got {order}")
    if order * math.log2(vocab_size + 1) >= 63:
        raise ValueError(f"order {order} with {vocab_size} tokens needs n-gram keys of over 63 bits; "
                         f"use order <= {int(63 / math.log2(vocab_size + 1) - 1e-9)}")
