"""The token n-gram language model: Kneser-Ney values worked by hand, normalisation, held-out
cross-entropy on real sentences falling with the order, its file round trip, shallow fusion
in beam search, and the internal language model it can subtract."""

from __future__ import annotations

import math

import pytest
import torch

from asr.decoding import internal_log_probs, modified_beam_search
from asr.language_model import END, NgramLanguageModel
from asr.text import TranscriptTokenizer, corpus_sentences
from zoo.corpora import shakespeare_text

from tiny_transducer import tiny, token_utterances


def test_kneser_ney_values_worked_by_hand():
    # Sentences "1 2" and "1 3", vocabulary 4 (END = 0). Unigrams from continuation counts:
    # END 2, 1: 1, 2: 1, 3: 1 (total 5, D1 = 3/(3+2*1) = 0.6) -> (c - 0.6)/5 + 0.6*4/5 * 1/4 = .4, .2, .2, .2.
    # Bigrams with raw counts, D2 = 4/(4+2*1): p(2|1) = (1 - 2/3)/2 + (2/3 * 2/2) * 0.2 = 0.3;
    # p(1|start) = (2 - 2/3)/2 + (2/3 * 1/2) * 0.2 = 11/15.
    lm = NgramLanguageModel.train([[1, 2], [1, 3]], vocab_size=4, order=2)
    expected = torch.tensor([2 / 3 * 0.4, 2 / 3 * 0.2, 0.3, 0.3], dtype=torch.float64)
    assert torch.allclose(lm.log_probs([1]).exp(), expected, atol=1e-12)
    assert lm.log_probs([]).exp()[1].item() == pytest.approx(11 / 15, abs=1e-12)
    assert torch.allclose(lm.log_probs([2, 3, 2, 3]).exp(), lm.log_probs([3]).exp())  # only the last order-1 count


@pytest.fixture(scope="module")
def sentences() -> list[list[int]]:
    tokenizer = TranscriptTokenizer("char")
    return [tokenizer.encode(s) for s in corpus_sentences(shakespeare_text(), max_words=10)[:3000]]


def cross_entropy(lm: NgramLanguageModel, sentences: list[list[int]]) -> float:
    """Nats per token (the sentence end included)."""
    total = sum(-float(lm.log_probs(s[:i])[token]) for s in sentences for i, token in enumerate([*s, END]))
    return total / sum(len(s) + 1 for s in sentences)


def test_distributions_sum_to_one_and_held_out_cross_entropy_falls_with_the_order(sentences):
    train, held_out = sentences[:2700], sentences[2700:]
    entropies = {}
    for order in (1, 3, 8):
        lm = NgramLanguageModel.train(train, vocab_size=29, order=order)
        for context in ([], held_out[0][:5], [27, 27, 27, 27, 27, 27, 27]):  # seen, and "'''''''" never seen
            assert lm.log_probs(context).exp().sum().item() == pytest.approx(1.0, abs=1e-12)
        entropies[order] = cross_entropy(lm, held_out)
    assert entropies[1] > 2.5 and entropies[3] < 0.7 * entropies[1] and entropies[8] < 0.9 * entropies[3]
    assert entropies[1] < math.log(29)  # even unigrams beat the uniform distribution


def test_round_trips_through_its_file_and_names_bad_input(tmp_path):
    lm = NgramLanguageModel.train([[1, 2, 3], [2, 2]], vocab_size=5, order=3)
    path = tmp_path / "lm.safetensors"
    path.write_bytes(lm.to_bytes())
    loaded = NgramLanguageModel.load(path)
    assert loaded.order == 3 and torch.equal(loaded.log_probs([1, 2]), lm.log_probs([1, 2]))
    with pytest.raises(ValueError, match=r"sentence 1 has ids outside 1..4: \[2, 5\]"):
        NgramLanguageModel.train([[1], [2, 5]], vocab_size=5)
    with pytest.raises(ValueError, match="order must be >= 1; got 0"):
        NgramLanguageModel.train([[1]], vocab_size=5, order=0)
    with pytest.raises(ValueError, match="order 8 with 300 tokens needs n-gram keys of over 63 bits; use order <= 7"):
        NgramLanguageModel.train([[1]], vocab_size=300, order=8)


def test_shallow_fusion_steers_beam_search_and_weight_zero_changes_nothing():
    model = tiny(seed=5).eval()  # untrained: its own choices are near random
    features, mask, _ = token_utterances(4, seed=4)
    encoded, lengths = model.encode(features, mask)
    lm = NgramLanguageModel.train([[3], [3, 3], [3, 3, 3, 3]], vocab_size=8, order=3)  # knows only token 3
    plain = modified_beam_search(model, encoded, lengths, beam=4, max_symbols_per_frame=2)
    assert modified_beam_search(model, encoded, lengths, 4, 2, language_model=lm, lm_weight=0.0) == plain
    fused = modified_beam_search(model, encoded, lengths, 4, 2, language_model=lm, lm_weight=5.0)
    assert any(set(h) - {3} for h in plain) and all(set(h) <= {3} for h in fused) and any(fused)
    with pytest.raises(ValueError, match="language_model must share the model's 8 tokens"):
        modified_beam_search(model, encoded, lengths, language_model=NgramLanguageModel.train([[1]], 5), lm_weight=1.0)


class InternalLanguageModel:
    """A transducer's internal language model (the joiner without the encoder, over non-blank
    tokens) as a LanguageModel, computed here in float64."""

    def __init__(self, model) -> None:
        self.model, self.vocab_size = model, model.config.vocab_size

    def log_probs(self, context) -> torch.Tensor:
        size, blank = self.model.config.context_size, self.model.config.blank_id
        tokens = torch.tensor([([blank] * size + list(context))[-size:]])
        projection = self.model.joiner.decoder_proj(self.model.decoder(tokens)[:, -1]).double()
        joiner = self.model.joiner.out
        logits = torch.tanh(projection) @ joiner.weight.double().T + joiner.bias.double()
        scores = torch.zeros(self.vocab_size, dtype=torch.float64)
        scores[1:] = logits[0, 1:].log_softmax(-1)  # blank (= END) 0: the sentence end adds nothing
        return scores


def test_subtracting_the_internal_language_model_cancels_fusing_it():
    model = tiny(seed=5).eval()
    internal = InternalLanguageModel(model)
    contexts = torch.tensor([[0, 0], [3, 5]])
    projection = model.joiner.decoder_proj(model.decoder(contexts)[:, -1])
    scores = internal_log_probs(model, projection)
    reference = torch.stack([internal.log_probs(c) for c in ([], [3, 5])])
    assert (scores - reference).abs().max() < 1e-5 and scores[:, 0].eq(0).all()
    assert torch.allclose(scores[:, 1:].exp().sum(-1), torch.ones(2, dtype=torch.float32))
    features, mask, _ = token_utterances(4, seed=4)
    encoded, lengths = model.encode(features, mask)
    plain = modified_beam_search(model, encoded, lengths, beam=4, max_symbols_per_frame=2)
    fused = modified_beam_search(model, encoded, lengths, 4, 2, language_model=internal, lm_weight=3.0)
    assert fused != plain  # fusing it alone changes the choices; subtracting it as well gives them back
    assert modified_beam_search(model, encoded, lengths, 4, 2, language_model=internal, lm_weight=3.0,
                                ilm_weight=3.0) == plain
    assert modified_beam_search(model, encoded, lengths, 4, 2, ilm_weight=3.0) == plain  # no fusion: nothing to subtract
