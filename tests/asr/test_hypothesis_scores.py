"""`asr.decoding.hypothesis_scores`: a hypothesis from elsewhere scored as the beam scores its own.
With a beam wide enough to keep every prefix, the beam's score of each final hypothesis is the sum
over all the alignments the search can take, which is what hypothesis_scores computes, with the
language model's and internal language model's terms; with one symbol a frame it is the RNN-T
loss's modified topology (`asr.losses.rnnt_loss`)."""

from __future__ import annotations

import pytest
import torch

from asr.decoding import beam_search_hypotheses, hypothesis_scores
from asr.language_model import NgramLanguageModel
from asr.losses import rnnt_loss

from tiny_transducer import tiny, token_utterances


@pytest.mark.parametrize("lm_weight, ilm_weight", [(0.0, 0.0), (0.7, 0.3)])
def test_an_unpruned_beams_scores_are_the_full_sums(lm_weight, ilm_weight):
    model = tiny(seed=3, vocab_size=3).eval()  # untrained: many hypotheses are likely
    features, mask, _ = token_utterances(1, seed=2)
    with torch.no_grad():
        encoded, lengths = model.encode(features[:, :16], mask[:, :16])
    frames = int(lengths[0])
    assert frames == 3  # 2 tokens, up to 2 a frame: at most 2^7 - 1 = 127 prefixes, all kept by a beam of 500
    lm = NgramLanguageModel.train([[1, 2], [2, 2, 1], [1]], vocab_size=3, order=2)
    finals = beam_search_hypotheses(model, encoded, lengths, beam=500, max_symbols_per_frame=2, language_model=lm,
                                    lm_weight=lm_weight, ilm_weight=ilm_weight)[0]
    scores = hypothesis_scores(model, encoded[0, :frames], [tokens for tokens, _ in finals], 2, lm, lm_weight, ilm_weight)
    assert scores == pytest.approx([score for _, score in finals], rel=1e-5, abs=1e-5)
    assert len(finals) == 127 and max(map(len, (t for t, _ in finals))) == 6  # every prefix: nothing pruned


def test_one_symbol_a_frame_is_the_modified_topology_of_the_rnnt_loss():
    model = tiny(seed=4, vocab_size=5).eval()
    features, mask, _ = token_utterances(1, seed=6)
    with torch.no_grad():
        encoded, lengths = model.encode(features, mask)
        frames, tokens = int(lengths[0]), [3, 1, 4, 4]
        decoder_out = model.decoder(torch.tensor([[0] + tokens]))
        logits = model.joiner(encoded[:, :frames, None], decoder_out[:, None])
        expected = -rnnt_loss(logits, torch.tensor([tokens]), torch.tensor([frames]), torch.tensor([4]),
                              topology="modified", reduction="sum")
    assert hypothesis_scores(model, encoded[0, :frames], [tokens], 1) == pytest.approx([float(expected)], rel=1e-5)
    with pytest.raises(ValueError, match="max_symbols_per_frame must be >= 1; got 0"):
        hypothesis_scores(model, encoded[0, :frames], [tokens], 0)
