"""Waveform augmentation for training a recogniser on synthetic speech: speed perturbation, additive
coloured noise and reverberation, drawn per utterance (SpecAugment, on the features, is in
`asr.features`).

    WaveformAugment(...)(waveform (N,), sample_rate) -> (N',) with N' = N / speed

- Speed perturbation (Ko et al., 2015): the waveform resampled as if played `speed` times faster,
  which shortens it and raises its pitch, as Kaldi and icefall do with 0.9 / 1.0 / 1.1.
- Noise: Gaussian noise whose spectrum falls as 1 / f^a, a uniform in [0, 2] (white to brown), at
  a signal-to-noise ratio uniform in snr_db (against the utterance's mean square).
- Reverberation: convolution with a synthetic room response, a direct impulse followed by Gaussian
  noise decaying by 60 dB over rt60 seconds (uniform in the range), scaled to the direct path's energy.

The defaults change nothing; ROBUST is the setting the open-vocabulary recipe trains with.
Draws come from torch's global generator (which the trainer seeds per step) or `generator`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import torch
from scipy.fft import next_fast_len

from asr.features import resample


@dataclass(frozen=True)
class WaveformAugment:
    """What is done to each training waveform, each part drawn independently per utterance."""

    speeds: tuple[float, ...] = (1.0,)
    """Speed factors, one drawn uniformly per utterance (1.0: unchanged)."""
    noise: float = 0.0
    """Probability of adding coloured noise."""
    snr_db: tuple[float, float] = (10.0, 30.0)
    """Range of the signal-to-noise ratio of the added noise, in dB."""
    reverb: float = 0.0
    """Probability of reverberating the utterance."""
    rt60: tuple[float, float] = (0.2, 0.8)
    """Range of the reverberation time (60 dB decay), in seconds."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "speeds", tuple(float(s) for s in self.speeds))  # a list from config.json
        if not self.speeds or min(self.speeds) < 0.5 or max(self.speeds) > 2.0:
            raise ValueError(f"WaveformAugment.speeds must be factors in [0.5, 2]; got {self.speeds}")
        if not (0 <= self.noise <= 1 and 0 <= self.reverb <= 1):
            raise ValueError(f"WaveformAugment.noise and reverb are probabilities; got {self.noise} and {self.reverb}")
        if self.snr_db[0] > self.snr_db[1] or not 0 < self.rt60[0] <= self.rt60[1]:
            raise ValueError(f"WaveformAugment needs ordered ranges snr_db and rt60 > 0; got {self.snr_db} and {self.rt60}")

    @property
    def active(self) -> bool:
        """Whether it changes anything."""
        return self.speeds != (1.0,) or self.noise > 0 or self.reverb > 0

    def __call__(self, waveform: torch.Tensor, sample_rate: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """waveform (N,) float -> augmented (N',) float32 (see the module docstring)."""
        x = waveform.double()
        speed = self.speeds[int(torch.randint(len(self.speeds), (1,), generator=generator))]
        if speed != 1.0:
            played_at = Fraction(sample_rate) * Fraction(speed).limit_denominator(100)
            x = resample(x, played_at.numerator, played_at.denominator * sample_rate)
        if float(torch.rand(1, generator=generator)) < self.reverb:
            x = reverberated(x, sample_rate, _uniform(*self.rt60, generator), generator)
        if float(torch.rand(1, generator=generator)) < self.noise:
            x = x + coloured_noise(x, _uniform(0.0, 2.0, generator), _uniform(*self.snr_db, generator), generator)
        return x.float()


ROBUST = WaveformAugment(speeds=(0.9, 1.0, 1.1), noise=0.5, reverb=0.3)
"""Speed perturbation of every utterance, noise on half of them, reverberation on 30%."""


def coloured_noise(signal: torch.Tensor, exponent: float, snr_db: float, generator: torch.Generator | None = None
                   ) -> torch.Tensor:
    """(N,) Gaussian noise with power spectrum ~ 1 / f^exponent, scaled to snr_db below signal (N,)'s
    mean square. Shaped at an FFT length with no prime factor above 5, then cut to N: at the
    utterance's own length, often with a large prime factor, pocketfft takes its slower path."""
    size = next_fast_len(signal.numel(), real=True)
    spectrum = torch.fft.rfft(torch.randn(size, generator=generator, dtype=torch.float64))
    frequencies = torch.arange(spectrum.numel(), dtype=torch.float64).clamp_min(1.0)
    noise = torch.fft.irfft(spectrum / frequencies ** (exponent / 2), n=size)[: signal.numel()]
    power = signal.double().square().mean()
    return noise * torch.sqrt(power / noise.square().mean().clamp_min(1e-20) / 10 ** (snr_db / 10))


def reverberated(signal: torch.Tensor, sample_rate: int, rt60: float, generator: torch.Generator | None = None
                 ) -> torch.Tensor:
    """signal (N,) convolved with a synthetic room response of reverberation time rt60 seconds,
    cut to N samples (the tail past the end is dropped)."""
    length = int(rt60 * sample_rate)
    t = torch.arange(length, dtype=torch.float64) / sample_rate
    tail = torch.randn(length, generator=generator, dtype=torch.float64) * torch.exp(-3 * math.log(10) * t / rt60)
    response = torch.cat([torch.ones(1, dtype=torch.float64), tail[1:] / tail[1:].norm().clamp_min(1e-20)])
    size = next_fast_len(signal.numel() + length - 1, real=True)  # holds the whole linear convolution: no wrap-around
    wet = torch.fft.irfft(torch.fft.rfft(signal.double(), n=size) * torch.fft.rfft(response, n=size), n=size)
    return wet[: signal.numel()]


def _uniform(low: float, high: float, generator: torch.Generator | None) -> float:
    return low + (high - low) * float(torch.rand(1, generator=generator))
