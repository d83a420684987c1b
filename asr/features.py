"""Speech features: resampling, the log-mel filterbank (from `torch.stft`), and SpecAugment.

    waveforms (B, N) at sample_rate -> log_mel -> (B, T, n_mels), T = N // hop_length + 1 frames

The mel filters are Slaney's (the mel scale linear below 1 kHz and logarithmic above, each
triangle normalised to unit area), as librosa's default and Whisper's front end use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import torch

from asr.loudness import scaled_to_level


@dataclass(frozen=True)
class FeatureConfig:
    """The log-mel front end."""

    sample_rate: int = 16000
    """Rate the features are computed at, in Hz; other rates are resampled to it."""
    n_fft: int = 400
    """Window and FFT length in samples (25 ms at 16 kHz); a periodic Hann window."""
    hop_length: int = 160
    """Samples between frames (10 ms at 16 kHz)."""
    n_mels: int = 80
    """Mel bins."""
    f_min: float = 0.0
    """Lowest filter edge, in Hz."""
    f_max: float | None = None
    """Highest filter edge, in Hz (None: sample_rate / 2)."""
    log_floor: float = 1e-10
    """Mel power is clamped to at least this before the (natural) log."""
    level_dbfs: float | None = -21.0
    """Each recording (each segment of a long one) is scaled so that its sounding frames are at this
    level, in dB of full scale, before its features are taken (`asr.loudness`); None: as recorded.
    -21 is espeak-ng's own level (the sounding frames of 12 held-out sentences: -21.4 to -17.8 dBFS,
    `python benchmarks/asr_awkward_audio.py`), which the shipped models were trained at."""

    def __post_init__(self) -> None:
        for name in ("sample_rate", "n_fft", "hop_length", "n_mels"):
            if getattr(self, name) < 1:
                raise ValueError(f"FeatureConfig.{name} must be >= 1; got {getattr(self, name)}")
        top = self.sample_rate / 2 if self.f_max is None else self.f_max
        if not 0 <= self.f_min < top <= self.sample_rate / 2:
            raise ValueError(f"FeatureConfig needs 0 <= f_min < f_max <= sample_rate/2 = {self.sample_rate / 2}; "
                             f"got f_min={self.f_min}, f_max={self.f_max}")

    def levelled(self, waveform: torch.Tensor) -> torch.Tensor:
        """waveform (N,) at sample_rate scaled to level_dbfs (unchanged when that is None)."""
        return waveform if self.level_dbfs is None else scaled_to_level(waveform, self.sample_rate, self.level_dbfs)

    def frames(self, samples: torch.Tensor) -> torch.Tensor:
        """Frames of waveforms of `samples` samples (centred STFT): samples // hop_length + 1."""
        return samples // self.hop_length + 1


def hz_to_mel(hz: torch.Tensor) -> torch.Tensor:
    """Slaney's mel scale: linear (3 mels per 200 Hz) below 1 kHz, logarithmic above."""
    linear = hz * 3 / 200
    log = 15 + torch.log(hz.clamp_min(1e-10) / 1000) * 27 / math.log(6.4)
    return torch.where(hz < 1000, linear, log)


def mel_to_hz(mel: torch.Tensor) -> torch.Tensor:
    """Inverse of `hz_to_mel`."""
    return torch.where(mel < 15, mel * 200 / 3, 1000 * torch.exp((mel - 15) * math.log(6.4) / 27))


def mel_filters(config: FeatureConfig, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """(n_fft // 2 + 1, n_mels) Slaney-normalised triangular filters: column m weighs the FFT bins
    between mel points m and m + 2, peaking at m + 1, with area-normalising height 2 / (f_{m+2} - f_m)."""
    top = config.sample_rate / 2 if config.f_max is None else config.f_max
    bins = torch.linspace(0, config.sample_rate / 2, config.n_fft // 2 + 1, dtype=torch.float64)
    mels = torch.linspace(hz_to_mel(torch.tensor(config.f_min, dtype=torch.float64)).item(),
                          hz_to_mel(torch.tensor(top, dtype=torch.float64)).item(), config.n_mels + 2, dtype=torch.float64)
    edges = mel_to_hz(mels)
    lower, centre, upper = edges[:-2], edges[1:-1], edges[2:]
    rising = (bins[:, None] - lower) / (centre - lower)
    falling = (upper - bins[:, None]) / (upper - centre)
    return (rising.minimum(falling).clamp_min(0) * (2 / (upper - lower))).to(dtype)


def resample(waveform: torch.Tensor, rate: int, target_rate: int) -> torch.Tensor:
    """(..., N) samples at `rate` Hz -> (..., ~N * target_rate / rate) at `target_rate`, by
    polyphase filtering (scipy's resample_poly: a Kaiser-windowed low-pass at the lower Nyquist)."""
    if rate < 1 or target_rate < 1:
        raise ValueError(f"sample rates must be >= 1 Hz; got {rate} and {target_rate}")
    if rate == target_rate:
        return waveform
    from scipy.signal import resample_poly

    ratio = Fraction(target_rate, rate)
    out = resample_poly(waveform.detach().cpu().double().numpy(), ratio.numerator, ratio.denominator, axis=-1)
    return torch.from_numpy(out).to(waveform.dtype)


def log_mel(waveforms: torch.Tensor, config: FeatureConfig, lengths: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, N) or (N,) waveforms at config.sample_rate (zero-padded past `lengths` (B,) samples) ->
    (features (B, T, n_mels) float32, frame_lengths (B,) int64). Frames are centred (reflect
    padding) so that T = N // hop_length + 1; features past a waveform's frames are set to the
    log floor."""
    batch = waveforms.unsqueeze(0) if waveforms.ndim == 1 else waveforms
    if batch.ndim != 2 or not batch.is_floating_point():
        raise ValueError(f"waveforms must be (B, N) or (N,) floating point; got {tuple(waveforms.shape)} {waveforms.dtype}")
    if batch.shape[1] <= config.n_fft // 2:
        raise ValueError(f"waveforms must be longer than n_fft/2 = {config.n_fft // 2} samples; got {batch.shape[1]}")
    lengths = torch.full((batch.shape[0],), batch.shape[1]) if lengths is None else lengths.long().cpu()
    window = torch.hann_window(config.n_fft, periodic=True, dtype=torch.float32, device=batch.device)
    spectrum = torch.stft(batch.float(), config.n_fft, config.hop_length, window=window, center=True,
                          pad_mode="reflect", return_complex=True)  # (B, n_fft/2 + 1, T)
    power = spectrum.real.square() + spectrum.imag.square()
    mel = torch.matmul(power.transpose(1, 2), mel_filters(config, torch.float32).to(batch.device))
    features = mel.clamp_min(config.log_floor).log()
    frame_lengths = config.frames(lengths)
    padding = torch.arange(features.shape[1])[None, :] >= frame_lengths[:, None]
    return features.masked_fill(padding.to(features.device)[..., None], math.log(config.log_floor)), frame_lengths


@dataclass(frozen=True)
class SpecAugment:
    """Frequency and time masks (Park et al., 2019) on normalised features, filled with 0 (the mean),
    after an optional warp of each utterance's mel axis by a random factor (vocal tract length
    perturbation, Jaitly and Hinton, 2013: a longer or shorter vocal tract scales the formants)."""

    freq_masks: int = 2
    """Frequency bands masked per utterance."""
    freq_width: int = 15
    """Largest band width, in mel bins (each width uniform in [0, freq_width])."""
    time_masks: int = 4
    """Time spans masked per utterance."""
    time_width: float = 0.05
    """Largest span, as a fraction of the utterance's frames."""
    freq_warp: float = 0.0
    """Largest warp: bin f of the output reads the input at f x a, a uniform in [1 - freq_warp,
    1 + freq_warp] per utterance (linear interpolation, the top bin repeated past the edge); 0: none."""

    def __post_init__(self) -> None:
        if min(self.freq_masks, self.freq_width, self.time_masks) < 0 or not 0 <= self.time_width < 1:
            raise ValueError(f"SpecAugment needs non-negative masks and widths and time_width in [0, 1); got {self}")
        if not 0 <= self.freq_warp < 0.5:
            raise ValueError(f"SpecAugment.freq_warp must be in [0, 0.5); got {self.freq_warp}")

    def __call__(self, features: torch.Tensor, frame_lengths: torch.Tensor,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """features (B, T, F), frame_lengths (B,) -> masked copy (B, T, F). Draws from `generator`
        (default torch's global one, which the trainer seeds per step)."""
        batch, frames, bins = features.shape
        if self.freq_warp:
            features = warp_frequencies(features, 1 + self.freq_warp * (2 * torch.rand(batch, generator=generator) - 1))
        keep = torch.ones(batch, frames, bins, dtype=torch.bool)
        freq = torch.arange(bins)
        for _ in range(self.freq_masks):
            width = torch.randint(0, self.freq_width + 1, (batch, 1), generator=generator)
            start = (torch.rand(batch, 1, generator=generator) * (bins - width + 1)).long()
            keep &= ~((freq >= start) & (freq < start + width))[:, None, :]
        time = torch.arange(frames)
        longest = (frame_lengths.cpu().float() * self.time_width).long()[:, None]
        for _ in range(self.time_masks):
            width = (torch.rand(batch, 1, generator=generator) * (longest + 1).float()).long()
            start = (torch.rand(batch, 1, generator=generator) * (frame_lengths.cpu()[:, None] - width + 1).float()).long()
            keep &= ~((time >= start) & (time < start + width))[:, :, None]
        return features * keep.to(features.device, features.dtype)


def warp_frequencies(features: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """features (B, T, F), factors (B,) -> (B, T, F): bin f of utterance b read at f x factors[b],
    interpolated linearly between neighbouring bins (clamped to the top bin)."""
    bins = features.shape[-1]
    position = (torch.arange(bins, dtype=torch.float32) * factors.float()[:, None]).clamp(max=bins - 1)  # (B, F)
    low = position.floor().long().clamp(max=bins - 2)
    weight = (position - low).to(features.device, features.dtype)[:, None, :]
    low = low.to(features.device)[:, None, :].expand(-1, features.shape[1], -1)
    return features.gather(2, low) * (1 - weight) + features.gather(2, low + 1) * weight
