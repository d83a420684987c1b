"""Word error rates of a recogniser on awkward audio: 12 held-out test sentences (espeak-ng, training
voices) at gains from 0.03 to 8 (clipped at full scale), with and without levelling the recording to
the training level first (`asr.loudness`); and the 12 sentences as one recording with 0.5 s pauses
(28 s: cut into segments, `asr.segmentation`) against the sentences alone.

    python benchmarks/asr_awkward_audio.py [MODEL] [--method greedy]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import tempfile
from pathlib import Path

import torch

from asr.data import CorpusConfig, read_audio, split_sentences
from asr.loudness import sounding_level
from asr.transcription import recogniser, transcribe
from asr.voices import speak, voices
from asr.wer import error_counts

GAINS = (0.03, 0.1, 0.3, 1.0, 3.0, 8.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default="asr-transducer-tiny")
    parser.add_argument("--method", choices=["greedy", "beam"], default="greedy")
    args = parser.parse_args()
    found = recogniser(args.model)
    texts = split_sentences(CorpusConfig())[2][:12]
    with tempfile.TemporaryDirectory() as folder:
        paths = [Path(folder) / f"{i}.wav" for i in range(len(texts))]
        for text, voice, path in zip(texts, voices("none", len(texts), random.Random(0)), paths):
            speak(text, voice, path)
        waves = [read_audio(path, 16000) for path in paths]

    def rate(waveforms: list[torch.Tensor], references: list[str], levelled: bool = True) -> float:
        features = found.features if levelled else dataclasses.replace(found.features, level_dbfs=None)
        heard = transcribe(found.model, waveforms, found.tokenizer, features, method=args.method, beam=found.beam,
                           language_model=found.language_model, lm_weight=found.lm_weight, ilm_weight=found.ilm_weight)
        return error_counts(references, heard).rate

    print(f"{args.model}, {args.method} search, {len(texts)} held-out sentences ({sum(len(t.split()) for t in texts)} words)\n")
    levels = [sounding_level(w, 16000) for w in waves]
    print(f"espeak-ng's level, sounding frames of the {len(waves)} clips: {min(levels):.1f} to {max(levels):.1f} dBFS\n")
    print("| gain | WER, levelled | WER, as recorded |\n|---|---|---|")
    for gain in GAINS:
        scaled = [(gain * w).clamp(-1, 1) for w in waves]
        print(f"| {gain:g} | {rate(scaled, texts):.3f} | {rate(scaled, texts, levelled=False):.3f} |")
    recording = torch.cat([torch.cat([w, torch.zeros(8000)]) for w in waves])
    print(f"\n| input | seconds | WER |\n|---|---|---|\n| the sentences alone | {sum(w.numel() for w in waves) / 16000:.1f} "
          f"| {rate(waves, texts):.3f} |\n| one recording, 0.5 s pauses, segmented | {recording.numel() / 16000:.1f} | "
          f"{rate([recording], [' '.join(texts)]):.3f} |")


if __name__ == "__main__":
    main()
