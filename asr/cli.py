"""`zoo transcribe`: transcribe WAV files with a zoo speech recogniser."""

from __future__ import annotations

import argparse

from asr.transcription import transcribe
from zoo.commands import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name")
    parser.add_argument("files", nargs="+", metavar="FILE.wav")
    parser.add_argument("--method", choices=["beam", "greedy"], default="beam")
    parser.add_argument("--beam", type=int, default=None, help="beam of the beam search (default: the model's own)")
    parser.add_argument("--lm-weight", type=float, default=None,
                        help="weight of the model's language model in beam search (default: the model's; 0: off)")
    parser.add_argument("--ilm-weight", type=float, default=None,
                        help="weight of the internal language model subtracted in the fusion (default: the model's)")


def run(args: argparse.Namespace) -> None:
    texts = transcribe(args.name, args.files, method=args.method, beam=args.beam, lm_weight=args.lm_weight,
                       ilm_weight=args.ilm_weight)
    for path, text in zip(args.files, texts):
        print(f"{path}: {text}")


TRANSCRIBE = Command("transcribe", "transcribe WAV files with a speech recogniser", add_arguments, run)
