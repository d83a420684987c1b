"""Streaming transcription: fed piece by piece, a chunk-wise transducer decodes the tokens that
greedy search gives on the whole recording encoded at once, within a bounded delay, also when it
encodes only a window of the recent audio."""

from __future__ import annotations

import pytest
import torch

from asr.decoding import greedy_search
from asr.features import FeatureConfig, log_mel
from asr.streaming import StreamingTranscriber
from asr.text import TranscriptTokenizer
from tiny_transducer import BINS, tiny

FEATURES = FeatureConfig(n_mels=BINS, level_dbfs=None)


def recording(seconds: float, seed: int) -> torch.Tensor:
    """Bursts of coloured noise and tones with pauses: audio a random model emits tokens on."""
    g = torch.Generator().manual_seed(seed)
    pieces = []
    while sum(p.numel() for p in pieces) < seconds * 16000:
        length = int(torch.randint(1600, 8000, (1,), generator=g))
        t = torch.arange(length) / 16000
        pieces += [0.3 * torch.sin(2 * torch.pi * float(torch.randint(100, 3000, (1,), generator=g)) * t)
                   + 0.05 * torch.randn(length, generator=g), torch.zeros(int(torch.randint(800, 4000, (1,), generator=g)))]
    return torch.cat(pieces)[: int(seconds * 16000)]


def offline_tokens(model, waveform: torch.Tensor) -> list[int]:
    features, _ = log_mel(waveform, FEATURES)
    encoded, lengths = model.encode(features)
    return greedy_search(model, encoded, lengths)[0]


def stream(model, waveform: torch.Tensor, chunk_ms: int, piece_ms: int, window_seconds: float = 20.0):
    transcriber = StreamingTranscriber(model, TranscriptTokenizer("char"), FEATURES, chunk_ms, window_seconds)
    piece = piece_ms * 16
    words = []
    for start in range(0, waveform.numel(), piece):
        words += transcriber.accept(waveform[start : start + piece])
    return transcriber, words + transcriber.finish()


@pytest.mark.parametrize("chunk_ms, piece_ms, window_seconds", [(160, 160, 20.0), (320, 50, 20.0), (160, 100, 3.0)])
def test_streaming_decodes_what_the_whole_recording_decodes(chunk_ms, piece_ms, window_seconds):
    """Window 3 s: longer than the tiny encoder's receptive field, 2 layers x (4 chunks x 4 + 14) = 60
    frames (2.4 s); the recording lasts 8 s."""
    model = tiny(seed=2, encoder_chunk_frames=4, encoder_left_chunks=4).eval()
    waveform = recording(8.0, seed=3)
    expected = offline_tokens(model, waveform)
    transcriber, words = stream(model, waveform, chunk_ms, piece_ms, window_seconds)
    assert len(expected) > 20  # the untrained model emits: the comparison is not between two empty lists
    assert transcriber.state.hypotheses[0] == expected
    # Only the window is kept: at most window_seconds, a chunk of window alignment and a step of new audio.
    assert transcriber.heard_samples == waveform.numel()
    assert transcriber.audio.numel() <= (window_seconds + (2 * chunk_ms + piece_ms) / 1000) * 16000
    assert [w.text for w in words] == transcriber.text.split()
    times = [w.emitted_at for w in words]
    assert times == sorted(times)
    # A token is decoded once its chunk and the look-ahead are heard, at the next step at the latest.
    lag = [w.decoded_at - w.frame_time for w in words[:-1]]
    assert max(lag) <= (160 + chunk_ms + 100 + piece_ms) / 1000 and min(lag) >= 0


def test_streaming_needs_a_chunk_wise_model_and_a_whole_number_of_chunks():
    with pytest.raises(ValueError, match="this model encodes with full context"):
        StreamingTranscriber(tiny(), TranscriptTokenizer("char"), FEATURES)
    with pytest.raises(ValueError, match="chunk_ms must be a multiple of the model's chunk, 160 ms"):
        StreamingTranscriber(tiny(encoder_chunk_frames=4), TranscriptTokenizer("char"), FEATURES, chunk_ms=200)


def test_a_dynamic_chunk_model_streams_in_any_whole_number_of_frames():
    model = tiny(seed=2, encoder_dynamic_chunks=8).eval()
    waveform = recording(6.0, seed=5)
    for chunk_ms in (120, 320):  # 3 and 8 frames of 40 ms
        expected = offline_tokens(model.with_chunk_frames(chunk_ms // 40), waveform)
        transcriber, _ = stream(model, waveform, chunk_ms, piece_ms=100)
        assert len(expected) > 10 and transcriber.state.hypotheses[0] == expected
    whole = StreamingTranscriber(model, TranscriptTokenizer("char"), FEATURES, chunk_ms=320)
    words = whole.stream_recording(waveform)  # a chunk at a time: the pieces above decode the same tokens
    assert whole.state.hypotheses[0] == transcriber.state.hypotheses[0]
    assert [w.text for w in words] == whole.text.split() and whole.heard_samples == waveform.numel()
    with pytest.raises(ValueError, match="chunk_ms must be a multiple of the model's frame, 40 ms; got 100"):
        StreamingTranscriber(model, TranscriptTokenizer("char"), FEATURES, chunk_ms=100)


def test_zoo_transcribe_streams_a_file_and_standard_input(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    from scipy.io import wavfile

    import zoo

    model = tiny(seed=2, encoder_chunk_frames=4).eval()
    zoo.save(model, tmp_path / "streamer", card="# test", extra={"tokenizer": TranscriptTokenizer("char").spec(),
                                                                  "features": FEATURES.__dict__})
    waveform = recording(4.0, seed=5)
    pcm = (waveform.clamp(-1, 32767 / 32768) * 32768).round().short()
    wavfile.write(tmp_path / "a.wav", 16000, pcm.numpy())
    zoo_cli = str(Path(sys.executable).parent / "zoo")
    expected = TranscriptTokenizer("char").decode(offline_tokens(model, pcm.float() / 32768)).split()
    from_file = subprocess.run([zoo_cli, "transcribe", str(tmp_path / "streamer"), str(tmp_path / "a.wav"), "--streaming",
                                "--chunk-ms", "160"], capture_output=True, text=True, timeout=120)
    assert from_file.returncode == 0, from_file.stderr[-2000:]
    assert from_file.stdout.split() == [f"{tmp_path / 'a.wav'}:", *expected]
    from_stdin = subprocess.run([zoo_cli, "transcribe", str(tmp_path / "streamer"), "-", "--streaming"],
                                input=pcm.numpy().tobytes(), capture_output=True, timeout=120)
    assert from_stdin.returncode == 0, from_stdin.stderr[-2000:]
    assert from_stdin.stdout.decode().split() == ["-:", *expected]
    whole = subprocess.run([zoo_cli, "transcribe", str(tmp_path / "streamer"), "-"], capture_output=True, text=True,
                           timeout=120)
    assert whole.returncode != 0 and "needs --streaming" in whole.stderr
