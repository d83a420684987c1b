"""What the shipped speech recognisers' tests share: one first pass over a set of recordings, read
with the entry's own second pass (Whisper's) and without it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from asr.data import read_audio
from asr.transcription import Recogniser, recogniser, searched_transcripts, segment_hypotheses
from asr.wer import error_counts
from asr.whisper_rescoring import Rescoring


def rescored_and_fused_rates(entry: str, paths: list[Path], references: list[str]) -> tuple[float, float, Recogniser]:
    """(the word error rate of zoo entry `entry` on the WAV files `paths` as it decodes them, the rate
    without Whisper's second pass (its language model only), the entry's recogniser), from one first pass."""
    found = recogniser(entry)
    searched = segment_hypotheses(found.model, [read_audio(path, found.features.sample_rate) for path in paths],
                                  found.tokenizer, found.features, found.beam, language_model=found.language_model,
                                  lm_weight=found.lm_weight, ilm_weight=found.ilm_weight)
    rescored = error_counts(references, searched_transcripts(found, searched)).rate
    fused = error_counts(references, searched_transcripts(dataclasses.replace(found, rescoring=Rescoring()), searched)).rate
    return rescored, fused, found
