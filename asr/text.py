"""Transcripts: normalisation, sentences cut from a corpus, and the output tokens of a transducer
(characters, or a SentencePiece-style BPE trained on the transcripts with `tokenizers`). Id 0 is
the blank in both."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import torch

CHARACTERS = " abcdefghijklmnopqrstuvwxyz'"
"""What a normalised transcript may hold."""
BLANK = "<blank>"
_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+")
_BRACKETS = re.compile(r"\[[^\]]*\]|\([^)]*\)")


def normalize(text: str) -> str:
    """Lower case, curly apostrophes straightened, every other character that is not a letter or
    an apostrophe made a space, apostrophes kept only inside words, white space collapsed."""
    text = text.lower().replace("\u2019", "'")
    text = re.sub(r"[^a-z']+", " ", text)
    return " ".join(word.strip("'") for word in text.split() if word.strip("'"))


def corpus_sentences(text: str, min_words: int = 3, max_words: int = 12, vocabulary_size: int = 2000) -> list[str]:
    """Distinct normalised sentences of `text` (cut after . ! ? ; :) with min_words..max_words words,
    every word among the corpus's `vocabulary_size` most frequent ones; in corpus order. Words in
    capitals (speaker names) and bracketed stage directions are dropped first; sentences holding
    digits are skipped."""
    candidates = []
    for raw in _SENTENCE_END.split(_BRACKETS.sub(" ", " ".join(text.split()))):
        if any(c.isdigit() for c in raw):
            continue
        kept = " ".join(w for w in raw.split() if not (len(w.strip(".,;:!?'")) > 1 and w.strip(".,;:!?'").isupper()))
        sentence = normalize(kept)
        if min_words <= len(sentence.split()) <= max_words:
            candidates.append(sentence)
    counts = Counter(word for sentence in candidates for word in sentence.split())
    vocabulary = {word for word, _ in counts.most_common(vocabulary_size)}
    return list(dict.fromkeys(s for s in candidates if all(w in vocabulary for w in s.split())))


class TranscriptTokenizer:
    """Transcripts <-> token ids, id 0 the blank. kind "char": one id per character of CHARACTERS;
    kind "bpe": a SentencePiece-style BPE (`tokenizers`) of `vocab_size` pieces."""

    def __init__(self, kind: Literal["char", "bpe"], bpe_json: str | None = None) -> None:
        if kind not in ("char", "bpe"):
            raise ValueError(f"kind must be 'char' or 'bpe'; got {kind!r}")
        if (kind == "bpe") != (bpe_json is not None):
            raise ValueError("a 'bpe' tokenizer needs its bpe_json (and a 'char' one none)")
        self.kind, self.bpe_json = kind, bpe_json
        self._bpe = None
        if kind == "bpe":
            from tokenizers import Tokenizer

            self._bpe = Tokenizer.from_str(bpe_json)
            if self._bpe.token_to_id(BLANK) != 0:
                raise ValueError(f"the BPE must have {BLANK} as id 0")

    @classmethod
    def train_bpe(cls, transcripts: Iterable[str], vocab_size: int) -> TranscriptTokenizer:
        """A BPE of `vocab_size` pieces (the blank and the characters included) learnt from transcripts."""
        from tokenizers import SentencePieceBPETokenizer

        bpe = SentencePieceBPETokenizer()
        bpe.train_from_iterator(list(transcripts), vocab_size=vocab_size, min_frequency=2,
                                special_tokens=[BLANK], initial_alphabet=list(CHARACTERS.strip()), show_progress=False)
        return cls("bpe", bpe.to_str())

    @property
    def vocab_size(self) -> int:
        return len(CHARACTERS) + 1 if self._bpe is None else self._bpe.get_vocab_size()

    def encode(self, transcript: str) -> list[int]:
        """A normalised transcript -> ids (1..vocab_size-1)."""
        if self._bpe is not None:
            return self._bpe.encode(transcript).ids
        unknown = set(transcript) - set(CHARACTERS)
        if unknown:
            raise ValueError(f"transcript has characters outside {CHARACTERS!r}: {sorted(unknown)}; normalize() it first")
        return [CHARACTERS.index(c) + 1 for c in transcript]

    def word_starts(self) -> torch.Tensor:
        """(vocab_size,) bool: the tokens that begin a new word (BPE: the pieces that begin with the
        word marker; characters: the space)."""
        if self._bpe is None:
            return torch.tensor([0] + [c == " " for c in CHARACTERS], dtype=torch.bool)
        marker = "\u2581"
        return torch.tensor([(self._bpe.id_to_token(i) or "").startswith(marker) for i in range(self.vocab_size)])

    def decode(self, ids: Sequence[int]) -> str:
        """Ids (blanks ignored) -> transcript."""
        ids = [i for i in ids if i != 0]
        if self._bpe is not None:
            return " ".join(self._bpe.decode(ids).split())
        return "".join(CHARACTERS[i - 1] for i in ids)

    def spec(self) -> dict[str, Any]:
        """What config.json stores to rebuild this tokenizer (`from_spec`)."""
        return {"kind": self.kind} if self.bpe_json is None else {"kind": "bpe", "bpe": json.loads(self.bpe_json)}

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> TranscriptTokenizer:
        return cls(spec["kind"], json.dumps(spec["bpe"]) if spec["kind"] == "bpe" else None)
