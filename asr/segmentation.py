"""Cutting long recordings into utterances an encoder takes whole: at pauses, and at the quietest
moments where a stretch runs on without one.

    segment_bounds(waveform (N,), sample_rate, max_seconds) -> [(start, end)] sample indices

Frames are 10 ms, silent by `asr.loudness.silent_frames` (far below the recording's loud level, or
below an absolute floor). A silent recording has no segment. Any other recording no longer than
max_seconds is one segment. A longer one is cut in the middle of every pause (a run of at least
min_pause seconds of silent frames); a stretch between pauses that is still longer than max_seconds
is cut greedily on the quietest frame between half of max_seconds and max_seconds after the previous
cut (and at least half of max_seconds before its end). Segments that are silent throughout are left
out; the others lose their silent edges but for KEEP_SILENCE seconds. Memory then grows with the
segment, not with the recording, and the model hears utterances as long as those it was trained on.
"""

from __future__ import annotations

import torch

from asr.loudness import FRAME_SECONDS, WINDOW_FRAMES, frame_levels, silent_frames

KEEP_SILENCE = 0.05
"""Seconds of silence kept before and after the sound of a segment cut from a long recording."""


def segment_bounds(waveform: torch.Tensor, sample_rate: int, max_seconds: float,
                   min_pause: float = 0.25) -> list[tuple[int, int]]:
    """[(start, end)] sample ranges of waveform (N,) in order, each at most max_seconds long (see
    the module docstring); silent recordings, and the silent stretches of long ones, are in none."""
    if waveform.ndim != 1:
        raise ValueError(f"waveform must be (N,); got shape {tuple(waveform.shape)}")
    shortest = 4 * FRAME_SECONDS * WINDOW_FRAMES
    if sample_rate < 1 or max_seconds < shortest or min_pause <= 0:
        raise ValueError(f"sample_rate must be >= 1, max_seconds >= {shortest} and min_pause > 0; got {sample_rate}, "
                         f"{max_seconds} and {min_pause}")
    total, longest = waveform.numel(), int(max_seconds * sample_rate)
    hop = max(1, int(FRAME_SECONDS * sample_rate))
    level = frame_levels(waveform, hop)  # (frames,) dB of full scale
    silent = silent_frames(level)
    if bool(silent.all()):
        return []
    if total <= longest:
        return [(0, total)]
    bounds = []
    margin = int(KEEP_SILENCE / FRAME_SECONDS)
    for start, end in _between_pauses(silent, int(min_pause / FRAME_SECONDS), hop, total):
        sounding = (~silent[start // hop : max(start // hop + 1, end // hop)]).nonzero()
        if len(sounding):
            start, end = (max(start, (start // hop + int(sounding[0]) - margin) * hop),
                          min(end, (start // hop + int(sounding[-1]) + 1 + margin) * hop))
            bounds += _quietest_cuts(level, start, end, longest, hop)
    return bounds


def _between_pauses(silent: torch.Tensor, min_frames: int, hop: int, total: int) -> list[tuple[int, int]]:
    """Sample ranges between the midpoints of the runs of at least `min_frames` silent frames."""
    cuts, run = [], 0
    for frame, quiet in enumerate(silent.tolist() + [False]):
        if quiet:
            run += 1
            continue
        if run >= min_frames:
            cuts.append((frame - run // 2) * hop)
        run = 0
    edges = [0, *[c for c in cuts if 0 < c < total], total]
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def _quietest_cuts(level: torch.Tensor, start: int, end: int, longest: int, hop: int) -> list[tuple[int, int]]:
    """[start, end) cut greedily on its quietest frames into pieces of longest / 2 to longest samples."""
    bounds = []
    while end - start > longest:
        first = (start + longest // 2) // hop
        last = max(first + 1, min(start + longest, end - longest // 2) // hop)
        cut = (first + int(level[first:last].argmin())) * hop
        bounds.append((start, cut))
        start = cut
    return bounds + [(start, end)]
