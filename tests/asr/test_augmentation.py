"""Waveform augmentation: speed perturbation shortens and raises, noise lands at its SNR with its
colour, reverberation decays at its RT60, the defaults change nothing, and training examples use it."""

from __future__ import annotations

import math

import pytest
import torch

from asr.augmentation import ROBUST, WaveformAugment, coloured_noise, reverberated

RATE = 16000


def tone(hz: float, seconds: float = 1.0) -> torch.Tensor:
    return 0.5 * torch.sin(2 * math.pi * hz * torch.arange(int(seconds * RATE), dtype=torch.float64) / RATE)


def peak_hz(x: torch.Tensor) -> float:
    return float(torch.fft.rfft(x.double()).abs().argmax()) * RATE / x.numel()


def test_the_defaults_change_nothing_and_bad_settings_are_refused():
    x = tone(300).float()
    assert not WaveformAugment().active and torch.equal(WaveformAugment()(x, RATE), x)
    assert ROBUST.active
    with pytest.raises(ValueError, match=r"speeds must be factors in \[0.5, 2\]; got \(3.0,\)"):
        WaveformAugment(speeds=(3.0,))
    with pytest.raises(ValueError, match="noise and reverb are probabilities"):
        WaveformAugment(noise=1.5)


@pytest.mark.parametrize("speed", [0.9, 1.1])
def test_speed_perturbation_shortens_and_raises_the_pitch(speed):
    out = WaveformAugment(speeds=(speed,))(tone(500), RATE)
    assert abs(out.numel() - RATE / speed) <= 1
    assert peak_hz(out) == pytest.approx(500 * speed, abs=2)


@pytest.mark.parametrize("exponent", [0.0, 2.0])
def test_noise_lands_at_its_snr_with_its_colour(exponent):
    signal = tone(440, 2.0)
    noise = coloured_noise(signal, exponent, 15.0, torch.Generator().manual_seed(0))
    assert 10 * math.log10(signal.square().mean() / noise.square().mean()) == pytest.approx(15.0, abs=1e-9)
    power = torch.fft.rfft(noise).abs().square()
    low, high = power[100:1000].mean(), power[10000:11000].mean()  # 50-500 Hz against 5-5.5 kHz
    bins = torch.arange(power.numel(), dtype=torch.float64)
    expected = (bins[100:1000] ** -exponent).mean() / (bins[10000:11000] ** -exponent).mean()  # a 1 / f^a spectrum
    assert 10 * math.log10(low / high) == pytest.approx(10 * math.log10(expected), abs=1.0)


def test_reverberation_decays_by_60_db_over_its_rt60():
    impulse = torch.zeros(RATE, dtype=torch.float64)
    impulse[0] = 1.0
    response = reverberated(impulse, RATE, 0.5, torch.Generator().manual_seed(1))
    assert response[0] == pytest.approx(1.0) and response[1:].square().sum() == pytest.approx(1.0, rel=1e-6)
    # Schroeder's backward integral of the tail: its slope is -60 dB per rt60.
    remaining = response[1:8000].square().flip(0).cumsum(0).flip(0)
    decay_db = 10 * math.log10(remaining[1000] / remaining[3000])  # over 2000 samples = 0.125 s
    assert decay_db == pytest.approx(60 * 0.125 / 0.5, abs=1.5)


def test_awkward_lengths_get_the_linear_convolution_and_noise_of_their_own_length():
    signal = torch.randn(4001, dtype=torch.float64, generator=torch.Generator().manual_seed(2))  # 4001 is prime
    wet = reverberated(signal, RATE, 0.05, torch.Generator().manual_seed(3))
    response = reverberated(torch.eye(800, dtype=torch.float64)[0], RATE, 0.05, torch.Generator().manual_seed(3))
    direct = torch.nn.functional.conv1d(signal.view(1, 1, -1), response.flip(0).view(1, 1, -1), padding=799)
    torch.testing.assert_close(wet, direct.view(-1)[:4001], rtol=0, atol=1e-12)
    noise = coloured_noise(signal, 1.0, 20.0, torch.Generator().manual_seed(4))
    assert noise.shape == (4001,)
    assert 10 * math.log10(signal.square().mean() / noise.square().mean()) == pytest.approx(20.0, abs=1e-9)


def test_training_examples_are_augmented_as_they_are_read(tmp_path):
    from scipy.io import wavfile

    from asr.data import SpeechExamples
    from asr.text import TranscriptTokenizer

    wavfile.write(tmp_path / "a.wav", RATE, (tone(300, 2.0) * 20000).short().numpy())
    rows = [{"audio": str(tmp_path / "a.wav"), "text": "a tone"}]
    plain = SpeechExamples(rows, TranscriptTokenizer("char"))[0]["input_features"]
    faster = SpeechExamples(rows, TranscriptTokenizer("char"), augment=WaveformAugment(speeds=(1.1,)))[0]["input_features"]
    assert plain.shape[0] == 201 and faster.shape[0] == 182  # 2 s at a 10 ms hop, then 2 s / 1.1
