"""The OPUS-MT Chinese -> English translator, imported from its CTranslate2 package
(`nlp.translation.ctranslate2_import`), translates real Chinese inputs (the example's distinct
sentences, then its lines) to CTranslate2's own tokens: 48 greedy, 24 with 4 beams
(`benchmarks/opus_zh_en.py` runs 200 both ways, with the time each takes)."""

from __future__ import annotations

import pytest
import torch

from nlp.translation.ctranslate2_import import read_vocabulary, translator_from_ctranslate2
from nlp.translation.decode import BeamSettings
from nlp.translation.opus_zh_en import example_sources, model_directory
from nlp.translation.tokenizer import detokenize

ctranslate2 = pytest.importorskip("ctranslate2")
sentencepiece = pytest.importorskip("sentencepiece")


@pytest.fixture(scope="module")
def imported():
    directory = model_directory()
    model, vocabulary = translator_from_ctranslate2(directory / "model"), read_vocabulary(directory / "model")
    pieces = sentencepiece.SentencePieceProcessor(model_file=str(directory / "sentencepiece.model"))
    peer = ctranslate2.Translator(str(directory / "model"), device="cpu", compute_type="float32", intra_threads=1)
    return model, vocabulary, pieces, peer, example_sources()[:48]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("beams", "count"), [(1, 48), (4, 24)])
def test_the_imported_translator_gives_ctranslate2s_tokens(imported, beams, count):
    model, vocabulary, pieces, peer, sources = imported
    sources = sources[:count]
    assert model.config.width == 512 and model.config.encoder_layers == 6
    tokenized = [pieces.encode(source, out_type=str) for source in sources]
    theirs = [result.hypotheses[0] for result in peer.translate_batch(tokenized, beam_size=beams,
                                                                      max_decoding_length=256)]
    ours = []
    for start in range(0, len(sources), 25):
        ids = [vocabulary.ids(tokens + [vocabulary.eos]) for tokens in tokenized[start:start + 25]]
        length = max(map(len, ids))
        source = torch.tensor([row + [model.config.eos_token_id] * (length - len(row)) for row in ids])
        mask = torch.tensor([[1] * len(row) + [0] * (length - len(row)) for row in ids])
        for row in model.generate(source, mask, BeamSettings(beams=beams, max_length_ratio=8.0, min_length=64)):
            ours.append(vocabulary.pieces([t for t in row if t != model.config.eos_token_id]))
    assert ours == theirs
    assert all(len(out) > 1 for out in ours) and detokenize(ours[0]).startswith("The wheel")  # 机轮震动大。
