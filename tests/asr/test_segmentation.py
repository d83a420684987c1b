"""Segmenting long recordings: cuts in the pauses, quietest-point cuts where there is none, silent
stretches left out, short recordings whole."""

from __future__ import annotations

import math

import pytest
import torch

from asr.segmentation import KEEP_SILENCE, segment_bounds

RATE = 16000


def tone(seconds: float, hz: float = 440.0) -> torch.Tensor:
    t = torch.arange(int(seconds * RATE)) / RATE
    return 0.3 * torch.sin(2 * math.pi * hz * t)


def test_a_long_recording_is_cut_in_its_pauses_and_trimmed_to_its_sound():
    silence = torch.zeros(RATE)  # 1 s
    noise = 1e-4 * torch.randn(int(0.5 * RATE), generator=torch.Generator().manual_seed(0))  # 70 dB below the tones
    waveform = torch.cat([tone(2.0), silence, tone(1.5, 300), noise, silence, tone(2.5, 600)])
    bounds = segment_bounds(waveform, RATE, max_seconds=3.0)
    starts = [0.0, 3.0, 6.0]
    ends = [2.0, 4.5, 8.5]
    assert len(bounds) == 3
    for (start, end), sound_start, sound_end in zip(bounds, starts, ends):
        assert abs(start / RATE - max(0.0, sound_start - KEEP_SILENCE)) <= 0.03
        assert abs(end / RATE - min(8.5, sound_end + KEEP_SILENCE)) <= 0.03


def test_a_stretch_without_pauses_is_cut_at_its_quietest_moments():
    waveform = tone(50.0) * (1 + 0.5 * torch.sin(2 * math.pi * 0.13 * torch.arange(50 * RATE) / RATE))
    bounds = segment_bounds(waveform, RATE, max_seconds=20.0)
    assert bounds[0][0] == 0 and bounds[-1][1] == waveform.numel()
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))  # contiguous: nothing dropped
    assert all(10.0 <= (end - start) / RATE <= 20.0 for start, end in bounds)
    # The first cut may fall anywhere in 10-20 s, more than one period (7.7 s) of the loudness: it
    # falls on a minimum (0.5 of the peak).
    assert 1 + 0.5 * math.sin(2 * math.pi * 0.13 * bounds[0][1] / RATE) < 0.52


def test_short_recordings_stay_whole_and_silent_stretches_are_left_out():
    assert segment_bounds(tone(5.0), RATE, max_seconds=20.0) == [(0, 5 * RATE)]
    assert segment_bounds(torch.zeros(30 * RATE), RATE, max_seconds=20.0) == []
    assert segment_bounds(1e-5 * tone(2.0), RATE, max_seconds=20.0) == []  # -103 dB of full scale
    with pytest.raises(ValueError, match=r"waveform must be \(N,\); got shape \(2, 10\)"):
        segment_bounds(torch.zeros(2, 10), RATE, 20.0)
    with pytest.raises(ValueError, match="max_seconds >= 0.12"):
        segment_bounds(tone(1.0), RATE, 0.1)
