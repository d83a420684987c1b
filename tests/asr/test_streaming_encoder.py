"""The Conformer's chunk-wise mode: a frame's encoding depends on no input after its chunk (but the
subsampling's 6-frame look-ahead), equals the encoding of the audio heard so far, and stays the same
alone or padded in a batch; so does a model trained with dynamic chunks, in any chunk it is given."""

from __future__ import annotations

import pytest
import torch

from asr.conformer import chunk_attention_mask
from tiny_transducer import BINS, tiny
from zoo.parity import relative_error

CHUNK = 4  # subsampled frames: 160 ms at 40 ms a frame


def last_input_frame(chunk: int) -> int:
    """The last input frame that chunk `chunk`'s encodings read: the 3x3 stride-2 convolutions read
    input frames 4t .. 4t + 6 for subsampled frame t."""
    return 4 * (CHUNK * chunk + CHUNK - 1) + 6


def chunk_wise(kind: str, left_chunks: int = 4):
    """A tiny transducer encoding in chunks of CHUNK frames: built so, or trained with dynamic chunks
    and given that chunk."""
    if kind == "fixed":
        return tiny(encoder_chunk_frames=CHUNK, encoder_left_chunks=left_chunks).eval()
    return tiny(encoder_dynamic_chunks=8, encoder_left_chunks=left_chunks).eval().with_chunk_frames(CHUNK)


@pytest.mark.parametrize("kind", ["fixed", "dynamic"])
@pytest.mark.parametrize("left_chunks", [1, -1])
def test_a_chunk_is_encoded_from_the_audio_heard_so_far(left_chunks, kind):
    model = chunk_wise(kind, left_chunks)
    features = torch.randn(1, 240, BINS, generator=torch.Generator().manual_seed(0))
    full, _ = model.encode(features)
    for chunk in (1, 5, 10):
        heard = last_input_frame(chunk) + 1
        so_far, _ = model.encode(features[:, :heard])
        frames = CHUNK * (chunk + 1)
        assert so_far.shape[1] == frames
        assert relative_error(so_far[0], full[0, :frames]) < 1e-5
        changed = features.clone()
        changed[:, heard:] += 1.0  # the future changes: chunk `chunk` and those before do not
        moved, _ = model.encode(changed)
        assert relative_error(moved[0, :frames], full[0, :frames]) < 1e-5
        assert relative_error(moved[0, frames:], full[0, frames:]) > 1e-2
    context, _ = tiny(encoder_chunk_frames=0).eval().encode(features[:, : last_input_frame(1) + 1])
    assert relative_error(context[0], full[0, : 2 * CHUNK]) > 1e-2  # the chunk-wise model is another model


@pytest.mark.parametrize("kind", ["fixed", "dynamic"])
def test_chunk_wise_encoding_is_the_same_alone_and_padded_in_a_batch(kind):
    model = chunk_wise(kind)
    g = torch.Generator().manual_seed(1)
    features, lengths = torch.randn(3, 180, BINS, generator=g), torch.tensor([180, 97, 41])
    mask = (torch.arange(180)[None, :] < lengths[:, None]).long()
    encoded, out_lengths = model.encode(features, mask)
    assert torch.isfinite(encoded).all()
    for row in range(3):
        alone, _ = model.encode(features[row : row + 1, : lengths[row]])
        assert relative_error(encoded[row, : out_lengths[row]], alone[0]) < 1e-5


def test_the_chunk_mask_sees_its_chunk_and_the_chunks_before_it():
    mask = torch.tensor([[True] * 6 + [False] * 2])
    allowed = chunk_attention_mask(mask, chunk_frames=2, left_chunks=1)[0].int()
    assert allowed.tolist() == [[1, 1, 0, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0],
                                [1, 1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0],
                                [0, 0, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 0, 0],
                                [0, 0, 0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 1, 1, 0, 1]]  # padded frames: themselves only


def test_dynamic_chunks_are_drawn_in_training_only():
    """Training draws full context half the time and otherwise a chunk of 1..dynamic_chunks frames, and
    attends as that chunk's mask says; evaluation encodes with chunk_frames, full context by default."""
    model = tiny(encoder_dynamic_chunks=6)
    encoder = model.encoder
    torch.manual_seed(0)
    draws = [encoder.drawn_chunk_frames() for _ in range(600)]
    assert set(draws) == set(range(7)) and 250 < draws.count(0) < 350
    features, lengths = torch.randn(2, 120, BINS), torch.tensor([120, 80])
    for seed in range(6):
        torch.manual_seed(seed)
        chunk = encoder.drawn_chunk_frames()
        torch.manual_seed(seed)
        carry = encoder.train().enter(features, lengths)
        if chunk:
            assert torch.equal(carry["attention_mask"], chunk_attention_mask(carry["mask"], chunk, 4))
        else:
            assert "attention_mask" not in carry
    assert "attention_mask" not in encoder.eval().enter(features, lengths)


def test_a_dynamic_chunk_model_shares_its_weights_in_every_chunk():
    model = tiny(seed=3, encoder_dynamic_chunks=8).eval()
    chunked = model.with_chunk_frames(CHUNK)
    assert chunked.config.encoder.chunk_frames == CHUNK and not chunked.training
    pairs = zip(model.state_dict().values(), chunked.state_dict().values(), strict=True)
    assert all(a.data_ptr() == b.data_ptr() for a, b in pairs)  # no copy
    built = tiny(encoder_chunk_frames=CHUNK).eval()  # the same shapes, chunk-wise from the start
    built.load_state_dict(model.state_dict())
    features = torch.randn(1, 200, BINS, generator=torch.Generator().manual_seed(4))
    assert relative_error(chunked.encode(features)[0], built.encode(features)[0]) < 1e-6
    full, _ = model.encode(features)  # full context, the convolution causal: another encoding
    assert relative_error(chunked.encode(features)[0], full) > 1e-2
    with pytest.raises(ValueError, match="needs a Conformer transducer trained with dynamic chunks"):
        tiny(encoder_chunk_frames=CHUNK).with_chunk_frames(2)
    with pytest.raises(ValueError, match="dynamic_chunks >= 0"):
        tiny(encoder_dynamic_chunks=-1)
    with pytest.raises(ValueError, match="conv_kernel must be odd"):  # the checks after it still run
        tiny(encoder_dynamic_chunks=8, encoder_conv_kernel=4)
