"""The word language model spelled in characters: every distribution sums to 1, a sentence's
characters multiply to exactly its word-model probability, the lexicon is closed, the file round
trips (both kinds through `load_language_model`), bad input is named, and beam search fused with
it spells only lexicon words."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from safetensors.numpy import save

from asr.decoding import modified_beam_search
from asr.language_model import END, NgramLanguageModel
from asr.text import TranscriptTokenizer, corpus_sentences
from asr.word_language_model import SPACE_ID, VOCAB_SIZE, WordLanguageModel, load_language_model
from zoo.corpora import shakespeare_text

from tiny_transducer import tiny, token_utterances

CHARS = TranscriptTokenizer("char")


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    return corpus_sentences(shakespeare_text(), max_words=10)[:4000]


@pytest.fixture(scope="module")
def lm(sentences) -> WordLanguageModel:
    return WordLanguageModel.train(sentences[:3800], order=3)


def test_distributions_sum_to_one_and_only_lexicon_spellings_have_mass(lm):
    for text in ("", "good mor", "good morrow", "good morrow ", "i am", "what's th"):
        probs = lm.log_probs(CHARS.encode(text)).exp()
        assert probs.sum().item() == pytest.approx(1.0, abs=1e-12), text
    at_start = lm.log_probs([]).exp()
    assert at_start[END] == 0 and at_start[SPACE_ID] == 0  # no empty sentence, no leading space
    mid_word = lm.log_probs(CHARS.encode("good mor")).exp()  # "mor" is no word: it can only go on
    assert mid_word[END] == 0 and mid_word[SPACE_ID] == 0
    following = {c for w in lm.lexicon if w.startswith("mor") and len(w) > 3 for c in w[3]}
    assert {CHARS.decode([i]) for i in mid_word.nonzero().squeeze(1).tolist()} == following
    for text in ("good morx", "qqq", "good  morrow", " good"):  # off the lexicon, or empty words
        assert torch.isneginf(lm.log_probs(CHARS.encode(text))).all(), text


def test_characters_multiply_to_the_word_models_sentence_probability(lm, sentences):
    ids = lm.word_ids
    checked = 0
    for sentence in sentences[3800:]:
        words = sentence.split()
        if not all(w in ids for w in words):
            continue
        tokens = CHARS.encode(sentence)
        spelled = sum(float(lm.log_probs(tokens[:i])[t]) for i, t in enumerate([*tokens, END]))
        word_ids = [ids[w] for w in words]
        direct = sum(float(lm.word_model.log_probs(word_ids[:i])[w]) for i, w in enumerate([*word_ids, END]))
        not_empty = math.log1p(-float(lm.word_model.log_probs([])[END].exp()))
        assert spelled == pytest.approx(direct - not_empty, rel=1e-10, abs=1e-10), sentence
        checked += 1
    assert checked >= 150


def test_held_out_sentences_cost_fewer_bits_than_under_the_token_8gram(lm, sentences):
    """Per character of held-out sentences made of lexicon words (end included)."""
    token_lm = NgramLanguageModel.train([CHARS.encode(s) for s in sentences[:3800]], VOCAB_SIZE, order=8)
    held_out = [s for s in sentences[3800:] if all(w in lm.word_ids for w in s.split())]

    def nats(model) -> float:
        return sum(-float(model.log_probs(CHARS.encode(s)[:i])[t]) for s in held_out
                   for i, t in enumerate([*CHARS.encode(s), END])) / sum(len(s) + 1 for s in held_out)

    word, token = nats(lm), nats(token_lm)
    assert word < 0.9 * token, (word, token)


def test_both_kinds_round_trip_through_their_file_and_bad_input_is_named(lm, tmp_path):
    word_file, token_file = tmp_path / "word.safetensors", tmp_path / "token.safetensors"
    word_file.write_bytes(lm.to_bytes())
    token_lm = NgramLanguageModel.train([[1, 2, 3], [2, 2]], vocab_size=5, order=3)
    token_file.write_bytes(token_lm.to_bytes())
    loaded = load_language_model(word_file)
    context = CHARS.encode("my lord i")
    assert isinstance(loaded, WordLanguageModel) and loaded.lexicon == lm.lexicon
    assert torch.equal(loaded.log_probs(context), lm.log_probs(context))
    assert isinstance(load_language_model(token_file), NgramLanguageModel)
    odd = tmp_path / "odd.safetensors"
    odd.write_bytes(save({"x": np.zeros(1)}, metadata={"kind": "phone"}))
    with pytest.raises(ValueError, match="has kind 'phone'; expected 'token' or 'word'"):
        load_language_model(odd)
    word_model = NgramLanguageModel.train([[1, 2]], vocab_size=3, order=2)
    with pytest.raises(ValueError, match="lexicon must be distinct words in sorted order"):
        WordLanguageModel(["b", "a"], word_model)
    with pytest.raises(ValueError, match=r"lexicon words must be non-empty, of the characters .*; got \['A'\]"):
        WordLanguageModel(["A", "b"], word_model)
    with pytest.raises(ValueError, match="word_model must have 4 ids"):
        WordLanguageModel(["a", "b", "c"], word_model)
    with pytest.raises(ValueError, match=r"context must be character token ids 1..28; got \[3, 0\]"):
        lm.log_probs([3, 0])


def test_fused_beam_search_spells_only_lexicon_words():
    model = tiny(seed=7, vocab_size=VOCAB_SIZE).eval()  # untrained: it spells nonsense on its own
    features, mask, _ = token_utterances(6, seed=2)
    encoded, lengths = model.encode(features, mask)
    lexicon = WordLanguageModel.train(["to be or not to be", "that is the question"], order=2)
    plain = [CHARS.decode(h) for h in modified_beam_search(model, encoded, lengths, beam=4, max_symbols_per_frame=2)]
    fused = [CHARS.decode(h) for h in modified_beam_search(model, encoded, lengths, 4, 2, language_model=lexicon,
                                                           lm_weight=2.0)]
    assert any(set(text.split()) - set(lexicon.lexicon) for text in plain)
    assert all(set(text.split()) <= set(lexicon.lexicon) for text in fused) and any(fused)
