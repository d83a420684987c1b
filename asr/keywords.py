"""Keyword spotting's features: the MFCCs MLPerf Tiny's keyword spotter reads (its
benchmark/training/keyword_spotting/get_dataset.py, TensorFlow's signal functions)."""

from __future__ import annotations

import math

import torch

SAMPLE_RATE = 16000
"""Samples a second of the clips the features are made of."""
CLIP_SAMPLES = 16000
"""A clip: one second."""


def _mel(hz: torch.Tensor) -> torch.Tensor:
    return 1127.0 * torch.log1p(hz / 700.0)


def keyword_mfccs(clip: torch.Tensor, window: int = 480, hop: int = 320, fft: int = 512, bands: int = 40,
                  low_hz: float = 20.0, high_hz: float = 4000.0, coefficients: int = 10) -> torch.Tensor:
    """(CLIP_SAMPLES,) samples at 16 kHz -> (1, frames, coefficients) float32 (49 x 10 by default):
    the magnitude STFT of periodic-Hann windows of `window` samples every `hop` (no padding), `bands`
    triangular mel bands from `low_hz` to `high_hz` (HTK's mel, unnormalised, the DC bin left out), the
    log of their sums plus 1e-6, and the first `coefficients` of its DCT-II scaled by 1 / sqrt(2 bands)."""
    if clip.shape != (CLIP_SAMPLES,):
        raise ValueError(f"clip must be ({CLIP_SAMPLES},) samples at {SAMPLE_RATE} Hz; got {tuple(clip.shape)}")
    frames = clip.double().unfold(0, window, hop) * torch.hann_window(window, periodic=True, dtype=torch.float64)
    magnitude = torch.fft.rfft(frames, fft).abs()
    edges = torch.linspace(_mel(torch.tensor(low_hz)).item(), _mel(torch.tensor(high_hz)).item(), bands + 2,
                           dtype=torch.float64)
    bins = _mel(torch.linspace(0, SAMPLE_RATE / 2, fft // 2 + 1, dtype=torch.float64))
    lower, centre, upper = edges[:-2], edges[1:-1], edges[2:]
    weights = ((bins[:, None] - lower) / (centre - lower)).minimum((upper - bins[:, None]) / (upper - centre))
    weights = weights.clamp_min(0)
    weights[0] = 0
    log_mel = torch.log(magnitude @ weights + 1e-6)
    n = torch.arange(bands, dtype=torch.float64)
    dct = 2 * torch.cos(math.pi / bands * (n[:, None] + 0.5) * n[None, :coefficients])
    return (log_mel @ dct / math.sqrt(2 * bands)).float()[None]
