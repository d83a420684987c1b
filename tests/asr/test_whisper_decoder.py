"""Whisper's text decoder imported from the packaged tiny.en model.bin: each token's probability as
CTranslate2's own decoder gives it (its alignment of the same tokens, on real recorded speech), and
the batched scoring (shared cross-attention keys, a tree of the distinct prefixes, one vocabulary
projection each) against each sequence scored alone in float64, and greedy transcription against CTranslate2's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asr.data import read_audio, recorded_speech
from asr.spoken_form import spoken_form
from asr.text import normalize
from asr.whisper_decoder import WhisperDecoder, WhisperDecoderConfig
from asr.whisper_encoder import packaged_whisper_tiny_en
from asr.whisper_rescoring import WhisperRescorer
from zoo.parity import relative_error


@pytest.fixture(scope="module")
def rescorer() -> WhisperRescorer:
    return WhisperRescorer()


@pytest.fixture(scope="module")
def librivox():
    row = next(r for r in recorded_speech() if r["set"] == "librivox")
    return read_audio(row["audio"], 16000), row["text"]


def test_the_import_reads_tiny_ens_decoder(rescorer):
    decoder = rescorer.decoder
    c = decoder.config
    assert (c.vocab_size, c.width, c.layers, c.heads, c.max_tokens) == (51864, 384, 4, 6, 448)
    # Whisper tiny's decoder has 29,551,872 parameters (embeddings tied to the output); the import
    # adds the zero biases of the self- and cross-attention keys, 2 x 4 x 384.
    assert sum(p.numel() for p in decoder.parameters()) == 29_551_872 + 2 * 4 * 384
    assert decoder.blocks[0].self_attn.k.bias.abs().max() == 0 and decoder.blocks[0].cross.k.bias.abs().max() == 0


@pytest.mark.timeout(300)
def test_each_token_is_as_probable_as_in_ctranslate2s_own_decoder(rescorer, librivox):
    import ctranslate2

    waveform, text = librivox
    reference = ctranslate2.models.Whisper(str(packaged_whisper_tiny_en().parent), device="cpu", compute_type="float32")
    features = rescorer.extractor([waveform.numpy()], sampling_rate=16000, return_tensors="np").input_features
    tokens = rescorer.tokens(text)
    # CTranslate2 teacher-forces a prompt and returns each step's logits; its max_length counts
    # about half as many steps as asked, so ask for twice the prompt.
    steps = reference.generate(reference.encode(ctranslate2.StorageView.from_array(np.ascontiguousarray(features))),
                               [rescorer.start + tokens[:-1]], beam_size=1, max_length=2 * (len(rescorer.start) + len(tokens)),
                               return_logits_vocab=True, suppress_blank=False, suppress_tokens=[])[0].logits[0]
    logits = torch.stack([torch.from_numpy(np.asarray(steps[k], dtype=np.float32)) for k in range(len(tokens))])
    expected = logits.double().log_softmax(-1)[torch.arange(len(tokens)), torch.tensor(tokens)]
    memories = rescorer.memories(waveform)
    # One token a sequence: the probability of each token after its true prefix.
    got = [rescorer.decoder.sequence_log_probs(memories, rescorer.start + tokens[:k], [[tokens[k]]])[0]
           for k in range(len(tokens))]
    assert relative_error(torch.tensor(got, dtype=torch.float64).exp(), expected.exp()) < 1e-4
    assert expected.exp().median() > 0.8  # Whisper hears this recording as read


def test_batched_scoring_is_each_sequence_alone_in_float64(rescorer, librivox):
    waveform, text = librivox
    encoded = rescorer.encode(waveform)
    words = text.split()
    texts = [text, " ".join(words[:-1]), " ".join(words[:3] + ["seven"] + words[4:]), "", text]
    sequences = [rescorer.tokens(t) for t in texts]
    batched = torch.tensor(rescorer.decoder.sequence_log_probs(rescorer.decoder.memories(encoded), rescorer.start,
                                                               sequences), dtype=torch.float64)
    decoder = WhisperDecoder(rescorer.decoder.config).double()
    decoder.load_state_dict(rescorer.decoder.state_dict())
    alone = []
    for sequence in sequences:
        inputs = torch.tensor([rescorer.start + sequence[:-1]])
        with torch.no_grad():
            log_probs = decoder.logits(decoder(inputs, encoded.double())).log_softmax(-1)[0]
        steps = torch.arange(len(rescorer.start) - 1, inputs.shape[1])
        alone.append(float(log_probs[steps, torch.tensor(sequence)].sum()))
    assert relative_error(batched, torch.tensor(alone)) < 1e-4
    assert batched[0] == batched[4] and batched[0] > batched[1:3].max()  # a missing and a wrong word cost


def test_a_tree_of_prefixes_may_hold_more_nodes_than_positions():
    torch.manual_seed(0)
    decoder = WhisperDecoder(WhisperDecoderConfig(vocab_size=10, width=8, layers=2, heads=2, max_tokens=4)).double()
    encoded = torch.randn(1, 5, 8, dtype=torch.float64)
    sequences = [[1, 2, 3], [4, 5, 6], [1, 2, 7], [8]]  # 6 distinct prefixes after the prompt, 4 positions
    tree = torch.tensor(decoder.sequence_log_probs(decoder.memories(encoded), [9], sequences), dtype=torch.float64)
    alone = []
    for sequence in sequences:
        with torch.no_grad():
            log_probs = decoder.logits(decoder(torch.tensor([[9] + sequence[:-1]]), encoded)).log_softmax(-1)[0]
        alone.append(float(log_probs[torch.arange(len(sequence)), torch.tensor(sequence)].sum()))
    assert relative_error(tree, torch.tensor(alone, dtype=torch.float64)) < 1e-12
    with pytest.raises(ValueError, match="a tree decodes without a cache, tokens \\(N, L\\) at positions \\(L,\\) below 4; "
                                         "got tokens \\(1, 2\\), positions up to 4"):
        decoder.decode(torch.zeros(1, 2, dtype=torch.long), decoder.memories(encoded),
                       tree=(torch.tensor([0, 4]), torch.ones(2, 2, dtype=torch.bool)))


def test_bad_shapes_are_refused_by_name():
    decoder = WhisperDecoder(WhisperDecoderConfig(vocab_size=10, width=8, layers=1, heads=2, max_tokens=4))
    with pytest.raises(ValueError, match=r"tokens must be \(N, L\) with 1 <= L <= 4; got \(1, 5\)"):
        decoder(torch.zeros(1, 5, dtype=torch.long), torch.zeros(1, 3, 8))
    with pytest.raises(ValueError, match=r"encoded must be one clip's \(1, T', 8\); got \(2, 3, 8\)"):
        decoder(torch.zeros(1, 2, dtype=torch.long), torch.zeros(2, 3, 8))
    with pytest.raises(ValueError, match="WhisperDecoderConfig.width must be divisible by heads"):
        WhisperDecoderConfig(width=10, heads=3)
    with pytest.raises(ValueError, match="every sequence must hold at least one token"):
        decoder.sequence_log_probs(decoder.memories(torch.zeros(1, 3, 8)), [1], [[2], []])


@pytest.mark.timeout(300)
def test_greedy_transcribes_as_ctranslate2s_greedy_search(rescorer, librivox):
    import ctranslate2

    waveform, text = librivox
    reference = ctranslate2.models.Whisper(str(packaged_whisper_tiny_en().parent), device="cpu", compute_type="float32")
    features = rescorer.extractor([waveform.numpy()], sampling_rate=16000, return_tensors="np").input_features
    expected = reference.generate(ctranslate2.StorageView.from_array(np.ascontiguousarray(features)), [rescorer.start],
                                  beam_size=1, suppress_blank=False)[0].sequences_ids[0]
    memories = rescorer.memories(waveform)
    got = rescorer.decoder.greedy(memories, rescorer.start, rescorer.end, max_new=100)
    assert got == expected
    assert rescorer.decoder.greedy(memories, rescorer.start, rescorer.end, max_new=3) == expected[:3]
    assert rescorer.transcript(memories, seconds=0.1) == normalize(spoken_form(rescorer.tokenizer.decode(expected[:2])))
    assert len(got) > 10 and normalize(spoken_form(rescorer.tokenizer.decode(got))).split()[:3] == text.split()[:3]
