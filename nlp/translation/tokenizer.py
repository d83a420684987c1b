"""`SentencePieceTokenizer`: text <-> a translator's token ids through a sentencepiece model.

Two kinds of translator carry one:
- an Argos Translate package (`package_tokenizer`): sentencepiece.model beside the CTranslate2
  folder model/, whose shared_vocabulary.json numbers the pieces (not sentencepiece's own ids: the
  two differ; pieces outside it read as its unknown token), and metadata.json naming the languages;
- a model folder trained here (`folder_tokenizer`): its own sentencepiece.model, whose ids are the
  model's (padding 0, unknown 1, EOS 2: `train_sentencepiece`).
A source ends with EOS when the model was trained so (both kinds here do).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import sentencepiece
import torch

from nlp.data import pad_sequences
from nlp.translation.ctranslate2_import import CTranslate2Vocabulary, read_vocabulary
from zoo.ctranslate2_io import ctranslate2_folder
from zoo.sources import package_folder

WORD_START = "\u2581"
"""Sentencepiece's mark of a piece that starts a word."""
MODEL_FILE = "sentencepiece.model"
"""The sentencepiece model's file name in a package or a model folder."""
PAD_ID, UNK_ID, EOS_ID = 0, 1, 2
"""The special ids of a sentencepiece model trained by `train_sentencepiece`."""


def detokenize(pieces: list[str]) -> str:
    """Sentencepiece pieces as text: joined, each word-start mark a space. (A vocabulary may hold
    pieces its sentencepiece model lacks, which that model's own decoder keeps as they are.)"""
    return "".join(pieces).replace(WORD_START, " ").strip()


class SentencePieceTokenizer:
    """Pieces from the sentencepiece model `model_file`, numbered by `vocabulary` when given (a
    CTranslate2 translator's), else by the model itself; `languages` = (source, target) ISO codes;
    `spec`: the JSON-able description that rebuilds it (`nlp.tokenizers.tokenizer_from_spec`)."""

    def __init__(self, model_file: Path, languages: tuple[str, str], spec: dict[str, Any],
                 vocabulary: CTranslate2Vocabulary | None = None) -> None:
        self._pieces = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
        self.languages, self._spec, self.vocabulary = tuple(languages), spec, vocabulary
        if vocabulary is None:
            self.eos_id, self.vocab_size, self.add_source_eos = self._pieces.eos_id(), self._pieces.get_piece_size(), True
        else:
            self.eos_id, self.vocab_size = vocabulary.tokens.index(vocabulary.eos), len(vocabulary.tokens)
            self.add_source_eos = vocabulary.add_source_eos

    def encode(self, text: str, eos: bool | None = None) -> list[int]:
        """The ids of `text`, EOS last when `eos` (default: as the model's sources end)."""
        if self.vocabulary is None:
            ids = self._pieces.encode(text)
        else:
            ids = self.vocabulary.ids(self._pieces.encode(text, out_type=str))
        return ids + [self.eos_id] if (self.add_source_eos if eos is None else eos) else ids

    def decode(self, ids: list[int]) -> str:
        """The text of target ids (EOS and what follows it dropped)."""
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        if self.vocabulary is None:
            return self._pieces.decode(ids)
        return detokenize(self.vocabulary.pieces(ids))

    def batch(self, ids: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
        """Encoded sources as a padded batch: input_ids and attention_mask, (B, longest) int64."""
        padded = pad_sequences([torch.tensor(row) for row in ids], pad_id)
        return {"input_ids": padded["input_ids"], "attention_mask": padded["attention_mask"]}

    def spec(self) -> dict[str, Any]:
        """JSON-able description (see `nlp.tokenizers.tokenizer_from_spec`)."""
        return dict(self._spec)


def package_tokenizer(source: str) -> SentencePieceTokenizer:
    """The tokenizer of the Argos Translate package that the declared source `source`
    (`zoo.sources`) returns."""
    package = package_folder(source)
    model_folder = ctranslate2_folder(package)
    if model_folder is None or not (package / MODEL_FILE).is_file():
        raise ValueError(f"source {source!r} ({package}) is not an Argos Translate package: "
                         f"expected model/model.bin and {MODEL_FILE}")
    metadata = json.loads((package / "metadata.json").read_text())
    return SentencePieceTokenizer(package / MODEL_FILE, (metadata["from_code"], metadata["to_code"]),
                                  {"kind": "package", "source": source}, read_vocabulary(model_folder))


def folder_tokenizer(folder: Path, languages: tuple[str, str]) -> SentencePieceTokenizer:
    """The tokenizer of a model folder holding its own sentencepiece.model."""
    path = Path(folder) / MODEL_FILE
    if not path.is_file():
        raise ValueError(f"{str(folder)!r} holds no {MODEL_FILE}, which its tokenizer spec names")
    return SentencePieceTokenizer(path, languages, {"kind": "sentencepiece", "languages": list(languages)})


def train_sentencepiece(texts: list[str], vocab_size: int, folder: Path) -> Path:
    """Train a unigram sentencepiece model of `vocab_size` pieces on `texts` (every character
    kept) into folder/sentencepiece.model, with padding 0, unknown 1, EOS 2 and no BOS."""
    folder.mkdir(parents=True, exist_ok=True)
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size, model_type="unigram",
        character_coverage=1.0, pad_id=PAD_ID, unk_id=UNK_ID, eos_id=EOS_ID, bos_id=-1, num_threads=1,
        minloglevel=2)
    (folder / MODEL_FILE).write_bytes(model.getvalue())
    return folder / MODEL_FILE
