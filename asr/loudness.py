"""Loudness of recordings: frame levels, silence, and scaling a recording to a reference level.

    frame_levels(waveform (N,), hop) -> (N // hop,) dB of full scale (a full-scale sine is -3 dB)
    silent_frames(levels) -> (frames,) bool
    sounding_level(waveform (N,), sample_rate) -> dB of full scale of its sounding frames (None if silent)
    scaled_to_level(waveform (N,), sample_rate, level_dbfs) -> (N,) with its sounding frames at level_dbfs

A recogniser trained on clips at one level (espeak-ng speaks at about -21 dB of full scale) hears a
quiet or loud recording as something else: the shipped Conformer's word error rate on 12 held-out
sentences went from 11% to 39% at a third of the amplitude and 99% at a tenth. Scaling every
recording to the training level first undoes that.
"""

from __future__ import annotations

import torch

FRAME_SECONDS = 0.01
"""Length of one frame."""
WINDOW_FRAMES = 3
"""Frames whose mean square gives a frame's level (30 ms around it)."""
SILENCE_DB = 40.0
"""A frame this many decibels below the recording's loud level is silent."""
LOUD_QUANTILE = 0.95
"""Quantile of the frame levels taken as the recording's loud level."""
FLOOR_DBFS = -70.0
"""A frame quieter than this is silent, however quiet the recording."""


def frame_levels(waveform: torch.Tensor, hop: int) -> torch.Tensor:
    """(frames,) level in dB of full scale of each `hop`-sample frame of waveform (N,): the mean square
    over the WINDOW_FRAMES frames around it (a trailing partial frame is left out; one frame at least)."""
    frames = max(1, waveform.numel() // hop)
    energy = torch.nn.functional.pad(waveform.double(), (0, max(0, hop - waveform.numel())))[: frames * hop]
    energy = energy.square().reshape(frames, hop).sum(1)
    window = torch.full((1, 1, WINDOW_FRAMES), 1 / (WINDOW_FRAMES * hop), dtype=energy.dtype)
    mean_square = torch.nn.functional.conv1d(energy[None, None], window, padding=WINDOW_FRAMES // 2)[0, 0]
    return 10 * torch.log10(mean_square + 1e-12)


def silent_frames(levels: torch.Tensor) -> torch.Tensor:
    """(frames,) True where a frame is below FLOOR_DBFS or SILENCE_DB below the loud level."""
    return levels < max(float(torch.quantile(levels, LOUD_QUANTILE)) - SILENCE_DB, FLOOR_DBFS)


def sounding_level(waveform: torch.Tensor, sample_rate: int) -> float | None:
    """Level in dB of full scale of the mean square of waveform (N,)'s sounding (not silent) frames;
    None when every frame is silent."""
    hop = max(1, int(FRAME_SECONDS * sample_rate))
    levels = frame_levels(waveform, hop)
    sounding = ~silent_frames(levels)
    if not bool(sounding.any()):
        return None
    if waveform.numel() < hop:
        samples = waveform.double()
    else:
        samples = waveform[: levels.numel() * hop].double().reshape(-1, hop)[sounding]
    return float(10 * torch.log10(samples.square().mean().clamp_min(1e-20)))


def scaled_to_level(waveform: torch.Tensor, sample_rate: int, level_dbfs: float) -> torch.Tensor:
    """waveform (N,) scaled so that the mean square of its sounding (not silent) frames is level_dbfs;
    a silent waveform is returned as it is. Samples may pass full scale: features take any float."""
    level = sounding_level(waveform, sample_rate)
    if level is None:
        return waveform
    return (waveform.double() * 10 ** ((level_dbfs - level) / 20)).to(waveform.dtype)
