"""The Conformer's chunk-wise mode: a frame's encoding depends on no input after its chunk (but the
subsampling's 6-frame look-ahead), equals the encoding of the audio heard so far, and stays the same
alone or padded in a batch."""

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


@pytest.mark.parametrize("left_chunks", [1, -1])
def test_a_chunk_is_encoded_from_the_audio_heard_so_far(left_chunks):
    model = tiny(encoder_chunk_frames=CHUNK, encoder_left_chunks=left_chunks).eval()
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


def test_chunk_wise_encoding_is_the_same_alone_and_padded_in_a_batch():
    model = tiny(encoder_chunk_frames=CHUNK).eval()
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
