"""Loudness: frame levels in dB of full scale, silence, and scaling to a level."""

from __future__ import annotations

import math

import pytest
import torch

from asr.loudness import frame_levels, scaled_to_level, silent_frames

RATE = 16000


def sine(seconds: float, amplitude: float) -> torch.Tensor:
    return amplitude * torch.sin(2 * math.pi * 500 * torch.arange(int(seconds * RATE)) / RATE)


def test_a_full_scale_sine_is_at_minus_3_db_and_silence_is_silent():
    levels = frame_levels(sine(1.0, 1.0), 160)
    assert levels.shape == (100,) and levels[1:-1].sub(10 * math.log10(0.5)).abs().max() < 1e-3
    waveform = torch.cat([sine(1.0, 0.5), torch.zeros(RATE), sine(1.0, 0.5 * 10 ** (-30 / 20))])
    silent = silent_frames(frame_levels(waveform, 160))
    assert not silent[5:95].any() and silent[105:195].all() and not silent[205:295].any()  # -30 dB is still sound


@pytest.mark.parametrize("amplitude", [1e-3, 0.1, 3.0])
def test_scaling_puts_the_sounding_frames_at_the_level_whatever_the_gain_and_the_pauses(amplitude):
    waveform = torch.cat([sine(0.5, amplitude), torch.zeros(2 * RATE), sine(0.5, amplitude)])
    scaled = scaled_to_level(waveform, RATE, -21.0)
    sound = torch.cat([scaled[: RATE // 2], scaled[-RATE // 2 :]])
    # within 0.15 dB: the frames at the edges of the pause count as sounding with part of their 10 ms silent
    assert 10 * math.log10(sound.double().square().mean()) == pytest.approx(-21.0, abs=0.15)
    assert scaled.dtype == waveform.dtype and scaled[RATE : 2 * RATE].abs().max() == 0
    assert torch.equal(scaled_to_level(torch.zeros(RATE), RATE, -21.0), torch.zeros(RATE))
