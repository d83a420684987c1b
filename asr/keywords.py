"""Keyword spotting's features: the MFCCs MLPerf Tiny's keyword spotter reads (its
benchmark/training/keyword_spotting/get_dataset.py, TensorFlow's signal functions), the same
normalised per clip for the zoo's own spotter (`keyword_features`), a recording as its one-second
clip (`centred_clip`), and their augmentation in training (`KeywordAugmentation`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from asr.features import resample

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


def keyword_features(clip: torch.Tensor) -> torch.Tensor:
    """(CLIP_SAMPLES,) samples at 16 kHz -> (1, 49, 10) float32: `keyword_mfccs` normalised per clip,
    each coefficient to mean 0 and standard deviation 1 over the clip's frames (+1e-3), which takes
    out a microphone's and a voice's constant colouring (cepstral mean and variance normalisation)."""
    return normalise_per_clip(keyword_mfccs(clip))


def normalise_per_clip(mfccs: torch.Tensor) -> torch.Tensor:
    """(..., frames, coefficients) MFCCs -> each coefficient at mean 0, standard deviation 1 (+1e-3)
    over the frames."""
    return (mfccs - mfccs.mean(-2, keepdim=True)) / (mfccs.std(-2, keepdim=True) + 1e-3)


def centred_clip(waveform: torch.Tensor, rate: int, start: int | None = None) -> torch.Tensor:
    """(samples,) at `rate` Hz -> (CLIP_SAMPLES,) at 16 kHz: resampled, its middle second if longer,
    placed at sample `start` of a silent second (None: centred)."""
    if waveform.ndim != 1:
        raise ValueError(f"waveform must be (samples,) mono; got {tuple(waveform.shape)}")
    samples = resample(waveform.float(), rate, SAMPLE_RATE)
    if samples.numel() > CLIP_SAMPLES:
        cut = (samples.numel() - CLIP_SAMPLES) // 2
        samples = samples[cut:cut + CLIP_SAMPLES]
    room = CLIP_SAMPLES - samples.numel()
    start = room // 2 if start is None else start
    if not 0 <= start <= room:
        raise ValueError(f"start must be in [0, {room}] for a clip of {samples.numel()} samples; got {start}")
    clip = torch.zeros(CLIP_SAMPLES)
    clip[start:start + samples.numel()] = samples
    return clip


@dataclass(frozen=True)
class KeywordAugmentation:
    """Random changes to a batch of keyword features in training: a roll in time, one masked span of
    frames and one of coefficients (SpecAugment's), Gaussian noise."""

    max_shift: int = 10
    """Frames a clip's features roll by, at most, either way (the clip wraps round)."""
    max_time_mask: int = 5
    """Frames of the zeroed span, at most."""
    max_coefficient_mask: int = 2
    """Coefficients of the zeroed span, at most."""
    noise: float = 0.05
    """Standard deviation of the added noise (the features are normalised to 1)."""

    def __post_init__(self) -> None:
        for name in ("max_shift", "max_time_mask", "max_coefficient_mask"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0; got {getattr(self, name)}")
        if self.noise < 0:
            raise ValueError(f"noise must be >= 0; got {self.noise}")

    def __call__(self, features: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """(B, 1, frames, coefficients) -> the same shape, changed."""
        batch, _, frames, coefficients = features.shape

        def draw(high: int) -> torch.Tensor:
            return torch.randint(0, high, (batch, 1), generator=generator)

        shift = draw(2 * self.max_shift + 1) - self.max_shift
        times = (torch.arange(frames) - shift) % frames
        rolled = features.gather(2, times[:, None, :, None].expand_as(features))
        time = torch.arange(frames)
        start, length = draw(frames), draw(self.max_time_mask + 1)
        frame_masked = (time >= start) & (time < start + length)
        coefficient = torch.arange(coefficients)
        start, length = draw(coefficients), draw(self.max_coefficient_mask + 1)
        coefficient_masked = (coefficient >= start) & (coefficient < start + length)
        masked = frame_masked[:, None, :, None] | coefficient_masked[:, None, None, :]
        noise = torch.randn(features.shape, generator=generator) * self.noise
        return rolled.masked_fill(masked, 0.0) + noise


FEATURES = {"keyword_mfccs": keyword_mfccs, "keyword_features": keyword_features}
"""The features a keyword spotter's config.json may name, by name: (CLIP_SAMPLES,) -> (1, 49, 10)."""
