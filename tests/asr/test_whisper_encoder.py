"""The Whisper encoder: the tiny.en checkpoint imported from its CTranslate2 model.bin encodes as
CTranslate2 itself does, the feature scaling matches transformers' WhisperFeatureExtractor, an
utterance encodes the same alone and padded, and a transducer on it trains and round-trips."""

from __future__ import annotations

import pytest
import torch

import zoo
from asr.whisper_encoder import WhisperEncoder, encoded_lengths, packaged_whisper_tiny_en, sinusoids
from asr.whisper_parity import encoder_error, feature_scaling_error
from tiny_transducer import tiny_whisper, token_utterances
from zoo.parity import relative_error


@pytest.fixture(scope="module")
def tiny_en() -> WhisperEncoder:
    return WhisperEncoder.from_ctranslate2(packaged_whisper_tiny_en()).eval()


@pytest.mark.parametrize("frames", [600, 3000])
def test_the_imported_encoder_matches_ctranslate2s_forward_pass(tiny_en, frames):
    assert encoder_error(tiny_en, frames) < 1e-5


def test_the_import_reads_tiny_ens_shape_and_whispers_positions(tiny_en):
    c = tiny_en.config
    assert (c.input_dim, c.width, c.layers, c.heads, c.max_frames) == (80, 384, 4, 6, 1500)
    # Whisper tiny's encoder has 7,632,384 parameters; the imported one adds four zero key biases of 384.
    assert sum(p.numel() for p in tiny_en.parameters()) == 7_632_384 + 4 * 384
    assert relative_error(tiny_en.positions, sinusoids(1500, 384)) < 1e-3  # stored in float16
    assert tiny_en.blocks[0].attn.k.bias.abs().max() == 0


def test_whisper_scaling_of_our_log_mel_is_the_whisper_feature_extractors():
    assert feature_scaling_error() < 1e-6


def test_an_utterance_encodes_the_same_alone_and_padded_in_a_batch():
    model = tiny_whisper().eval()
    features, mask, _ = token_utterances(3, seed=1)
    encoded, lengths = model.encode(features, mask)
    assert lengths.tolist() == [encoded_lengths(int(n)) for n in mask.sum(1)] == [(int(n) + 1) // 2 for n in mask.sum(1)]
    for row in range(3):
        frames = int(mask[row].sum())
        alone, _ = model.encode(features[row : row + 1, :frames])
        assert relative_error(encoded[row, : lengths[row]], alone[0]) < 1e-5
    with pytest.raises(ValueError, match="at most 128 frames"):
        model.encode(torch.zeros(1, 129, features.shape[-1]))


def test_a_whisper_transducer_learns_tokens_and_round_trips(tmp_path):
    model = tiny_whisper(loss="pruned", warm_steps=10, prune_range=3)
    features, mask, labels = token_utterances(8, seed=0)
    optimizer = torch.optim.Adam(model.parameters(), 3e-3)
    losses = []
    for step in range(40):
        model.set_training_step(step)
        loss = model(features, mask, labels)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    zoo.save(model, tmp_path / "asr", card="# test")
    loaded = zoo.load(tmp_path / "asr").eval()
    assert loaded.config == model.config
    model.eval()
    assert torch.equal(loaded(features, mask)["encoder_out"], model(features, mask)["encoder_out"])


def test_the_plan_names_the_encoders_blocks_and_linears():
    model = tiny_whisper()
    plan = model.parallel_plan()
    assert plan.block_names(model) == ["encoder.blocks.0", "encoder.blocks.1"]
    modules = dict(model.named_modules())
    for pattern in plan.colwise + plan.rowwise:
        assert pattern.replace("*", "0") in modules, pattern
    assert set(plan.pipeline.pre) | set(plan.pipeline.post) <= set(modules) | {n for n, _ in model.named_buffers()}


def test_the_config_refuses_a_mismatched_encoder():
    from asr.model import TransducerConfig

    with pytest.raises(TypeError, match="must be a WhisperEncoderConfig for encoder_kind 'whisper'"):
        TransducerConfig(encoder_kind="whisper")
    with pytest.raises(ValueError, match="encoder_kind must be one of"):
        TransducerConfig(encoder_kind="lstm")
