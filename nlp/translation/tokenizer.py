"""`PackageTokenizer`: text <-> the token ids of a translator shipped as an Argos Translate package
(sentencepiece.model beside the CTranslate2 folder model/, whose shared_vocabulary.json numbers the
pieces, and metadata.json naming the languages).

Pieces come from the sentencepiece model and are numbered by the translator's vocabulary (not by
sentencepiece's own ids: the two differ); a source ends with EOS when the package says so; pieces
outside the vocabulary read as its unknown token.
"""

from __future__ import annotations

import json
from typing import Any

import sentencepiece
import torch

from nlp.data import pad_sequences
from nlp.translation.ctranslate2_import import read_vocabulary
from zoo.ctranslate2_io import ctranslate2_folder
from zoo.sources import package_folder

WORD_START = "\u2581"
"""Sentencepiece's mark of a piece that starts a word."""


def detokenize(pieces: list[str]) -> str:
    """Sentencepiece pieces as text: joined, each word-start mark a space. (A vocabulary may hold
    pieces its sentencepiece model lacks, which that model's own decoder keeps as they are.)"""
    return "".join(pieces).replace(WORD_START, " ").strip()


class PackageTokenizer:
    """The tokenizer of the Argos Translate package that the declared source `source` (`zoo.sources`)
    returns; `languages` = (source language, target language), ISO codes."""

    def __init__(self, source: str) -> None:
        self.source = source
        package = package_folder(source)
        model_folder = ctranslate2_folder(package)
        if model_folder is None or not (package / "sentencepiece.model").is_file():
            raise ValueError(f"source {source!r} ({package}) is not an Argos Translate package: "
                             "expected model/model.bin and sentencepiece.model")
        self.vocabulary = read_vocabulary(model_folder)
        self.eos_id = self.vocabulary.tokens.index(self.vocabulary.eos)
        self.vocab_size = len(self.vocabulary.tokens)
        metadata = json.loads((package / "metadata.json").read_text())
        self.languages = (metadata["from_code"], metadata["to_code"])
        self._pieces = sentencepiece.SentencePieceProcessor(model_file=str(package / "sentencepiece.model"))

    def encode(self, text: str) -> list[int]:
        """The source ids of `text` (EOS last when the package's sources end with it)."""
        ids = self.vocabulary.ids(self._pieces.encode(text, out_type=str))
        return ids + [self.eos_id] if self.vocabulary.add_source_eos else ids

    def decode(self, ids: list[int]) -> str:
        """The text of target ids (EOS and what follows it dropped)."""
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        return detokenize(self.vocabulary.pieces(ids))

    def batch(self, ids: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
        """Encoded sources as a padded batch: input_ids and attention_mask, (B, longest) int64."""
        padded = pad_sequences([torch.tensor(row) for row in ids], pad_id)
        return {"input_ids": padded["input_ids"], "attention_mask": padded["attention_mask"]}

    def spec(self) -> dict[str, Any]:
        """JSON-able description (see `nlp.tokenizers.tokenizer_from_spec`)."""
        return {"kind": "package", "source": self.source}

