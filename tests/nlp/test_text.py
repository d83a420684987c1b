"""Tokenizers, the Shakespeare corpus and language-modelling examples."""

from __future__ import annotations

import pytest
import torch

from nlp.data import TokenBlocks
from zoo.corpora import shakespeare_text, strip_gutenberg
from nlp.tokenizers import CharTokenizer, GPT2Tokenizer, tokenizer_from_spec


def test_gpt2_tokenizer_matches_known_ids():
    tokenizer = GPT2Tokenizer()
    assert tokenizer.vocab_size == 50257
    assert tokenizer.encode("Hello world") == [15496, 995]
    text = "To be, or not to be: that is the question.\n"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert isinstance(tokenizer_from_spec(tokenizer.spec()), GPT2Tokenizer)


def test_char_tokenizer_round_trip_and_errors():
    tokenizer = CharTokenizer.from_text("hello world")
    assert tokenizer.vocab_size == 8
    assert tokenizer.decode(tokenizer.encode("low")) == "low"
    assert tokenizer_from_spec(tokenizer.spec()).encode("old") == tokenizer.encode("old")
    with pytest.raises(ValueError, match="character 'z' is not in this tokenizer's alphabet"):
        tokenizer.encode("zoo")


def test_shakespeare_corpus_is_the_42_gutenberg_texts():
    text = shakespeare_text()
    assert 5_000_000 < len(text) < 5_100_000
    assert "To be, or not to be" in text and "*** START OF" not in text


def test_strip_gutenberg_keeps_the_body():
    assert strip_gutenberg("header\n*** START OF THIS EBOOK ***\nbody\n*** END OF THIS EBOOK ***\nlicense") == "body\n"


def test_token_blocks_are_hugging_face_examples_predicting_each_token_once():
    blocks = TokenBlocks(torch.arange(10), block_size=3)
    assert len(blocks) == 4
    assert blocks[1]["input_ids"].tolist() == [2, 3, 4] and blocks[1]["labels"].tolist() == [2, 3, 4]
    predicted = [t for i in range(len(blocks)) for t in blocks[i]["labels"][1:].tolist()]
    assert predicted == list(range(1, 9))
    with pytest.raises(IndexError):
        blocks[4]
    with pytest.raises(ValueError, match="at least block_size=3 tokens"):
        TokenBlocks(torch.arange(2), block_size=3)
