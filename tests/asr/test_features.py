"""Log-mel features against transformers' independent numpy front end (Whisper's mel filters and
`audio_utils.spectrogram`), resampling, and SpecAugment."""

from __future__ import annotations

import pytest
import torch
from transformers import WhisperFeatureExtractor
from transformers.audio_utils import mel_filter_bank, spectrogram, window_function

from asr.features import FeatureConfig, SpecAugment, log_mel, mel_filters, resample, warp_frequencies
from zoo.parity import relative_error


def tone(seconds: float, rate: int, hz: float = 440.0, seed: int = 0) -> torch.Tensor:
    t = torch.arange(int(seconds * rate), dtype=torch.float64) / rate
    noise = torch.randn(t.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return 0.3 * torch.sin(2 * torch.pi * hz * t) + 0.05 * noise


def test_mel_filters_are_whispers():
    theirs = torch.from_numpy(WhisperFeatureExtractor(feature_size=80).mel_filters)
    assert relative_error(mel_filters(FeatureConfig()), theirs) < 1e-12
    assert relative_error(mel_filters(FeatureConfig(n_mels=40, f_min=20.0, f_max=7600.0)),
                          torch.from_numpy(mel_filter_bank(201, 40, 20.0, 7600.0, 16000, norm="slaney",
                                                           mel_scale="slaney"))) < 1e-12


def test_log_mel_matches_the_numpy_spectrogram_of_transformers():
    config = FeatureConfig()
    waveform = tone(1.3, 16000)
    features, frames = log_mel(waveform.float(), config)
    theirs = spectrogram(waveform.numpy(), window_function(400, "hann"), frame_length=400, hop_length=160, power=2.0,
                         mel_filters=mel_filters(config).numpy(), log_mel=None)
    assert features.shape == (1, 20801 // 160 + 1, 80) and frames.tolist() == [20800 // 160 + 1]
    assert relative_error(features[0].double().exp(), torch.from_numpy(theirs).T) < 1e-5


def test_padded_batches_give_each_waveform_its_own_frames():
    config = FeatureConfig()
    short, long = tone(0.5, 16000, seed=1).float(), tone(0.8, 16000, seed=2).float()
    batch = torch.zeros(2, long.numel())
    batch[0, : short.numel()], batch[1] = short, long
    features, frames = log_mel(batch, config, torch.tensor([short.numel(), long.numel()]))
    alone, _ = log_mel(short, config)
    assert frames.tolist() == [51, 81]
    # Frames whose window lies inside the short waveform are the same; past its end, the floor.
    assert relative_error(features[0, :48], alone[0, :48]) < 1e-6
    assert (features[0, 51:] == torch.tensor(config.log_floor).log()).all()
    with pytest.raises(ValueError, match="waveforms must be longer than n_fft/2 = 200 samples; got 100"):
        log_mel(torch.zeros(100), config)


def test_resampling_keeps_the_pitch_and_the_duration():
    resampled = resample(tone(1.0, 22050, hz=1000.0), 22050, 16000)
    assert resampled.shape == (16000,)
    spectrum = torch.fft.rfft(resampled * torch.hann_window(16000, dtype=torch.float64)).abs()
    assert spectrum.argmax().item() == 1000  # 1 Hz per bin over one second
    assert resample(tone(0.1, 16000), 16000, 16000).shape == (1600,)
    with pytest.raises(ValueError, match="sample rates must be >= 1 Hz"):
        resample(torch.zeros(10), 0, 16000)


def test_spec_augment_masks_bands_and_spans_within_each_utterance():
    augment = SpecAugment(freq_masks=2, freq_width=10, time_masks=3, time_width=0.1)
    features = torch.randn(4, 300, 80) + 5.0  # no natural zeros
    lengths = torch.tensor([300, 200, 100, 50])
    masked = augment(features, lengths, torch.Generator().manual_seed(0))
    zero = masked == 0
    assert ((masked == features) | zero).all()
    bands, spans = zero.all(1), zero.all(2)
    for row, length in enumerate(lengths.tolist()):
        assert 0 < bands[row].sum() <= 20 and spans[row].sum() <= 3 * int(0.1 * length)
        assert not spans[row, length:].any()  # masks stay inside the utterance
    assert spans.any()
    assert masked.equal(augment(features, lengths, torch.Generator().manual_seed(0)))
    with pytest.raises(ValueError, match="SpecAugment needs non-negative masks"):
        SpecAugment(time_width=1.5)


def test_frequency_warp_reads_each_utterance_at_scaled_bins():
    ramp = torch.arange(80.0).expand(2, 5, 80)  # feature value = its bin: a warp reads back the position
    warped = warp_frequencies(ramp, torch.tensor([0.9, 1.1]))
    assert torch.allclose(warped[0], (torch.arange(80.0) * 0.9).expand(5, 80), atol=1e-4)
    assert torch.allclose(warped[1], (torch.arange(80.0) * 1.1).clamp(max=79).expand(5, 80), atol=1e-4)
    assert torch.equal(warp_frequencies(ramp, torch.ones(2)), ramp)
    augment = SpecAugment(freq_masks=0, time_masks=0, freq_warp=0.2)
    out = augment(ramp, torch.tensor([5, 5]), torch.Generator().manual_seed(3))
    slopes = out[:, 0, 10] / 10  # the factor drawn for each utterance
    assert ((slopes - 1).abs() <= 0.2).all() and not torch.allclose(slopes[0], slopes[1])
    assert torch.allclose(out[:, 0, :40], torch.arange(40.0) * slopes[:, None], atol=1e-4)
    with pytest.raises(ValueError, match=r"SpecAugment.freq_warp must be in \[0, 0.5\); got 0.7"):
        SpecAugment(freq_warp=0.7)
