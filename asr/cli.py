"""`zoo transcribe`: transcribe WAV files with a zoo speech recogniser, whole or as a stream;
`zoo spot`: the keyword of each WAV file by a zoo keyword spotter."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

import torch

from asr.data import read_audio_pieces
from asr.spotting import spot_files
from asr.streaming import StreamingTranscriber
from asr.transcription import model_rescoring, recogniser, transcribe
from zoo.commands import Command, ranked_line
from zoo.store import read_config

STDIN = "-"
"""The FILE that reads raw 16-bit little-endian mono PCM at the model's rate from standard input (streaming)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name")
    parser.add_argument("files", nargs="+", metavar="FILE.wav")
    parser.add_argument("--method", choices=["beam", "greedy"], default="beam")
    parser.add_argument("--beam", type=int, default=None, help="beam of the beam search (default: the model's own)")
    parser.add_argument("--lm-weight", type=float, default=None,
                        help="weight of the model's language model in beam search, and of its soft lexicon's "
                             "penalty (default: the model's; 0: both off)")
    parser.add_argument("--ilm-weight", type=float, default=None,
                        help="weight of the internal language model subtracted in the fusion (default: the model's)")
    parser.add_argument("--rescore-weight", type=float, default=None,
                        help="weight of Whisper tiny.en's second pass over the beam's n-best (default: the model's; "
                             "0: the first pass alone)")
    parser.add_argument("--streaming", action="store_true",
                        help="decode as the audio arrives, printing words as they are complete (greedy; needs a "
                             f"chunk-wise model); FILE {STDIN} reads raw 16-bit mono PCM at the model's rate from stdin")
    parser.add_argument("--chunk-ms", type=int, default=320, help="streaming: audio per decoding step, in ms")


def run(args: argparse.Namespace) -> None:
    if args.streaming:
        for path in args.files:
            stream(args.name, path, args.chunk_ms)
        return
    if STDIN in args.files:
        raise ValueError(f"FILE {STDIN} (standard input) needs --streaming")
    rescoring = None
    if args.rescore_weight is not None:
        rescoring = replace(model_rescoring(read_config(args.name)), weight=args.rescore_weight)
    texts = transcribe(args.name, args.files, method=args.method, beam=args.beam, lm_weight=args.lm_weight,
                       ilm_weight=args.ilm_weight, rescoring=rescoring)
    for path, text in zip(args.files, texts):
        print(f"{path}: {text}")


def stream(name: str, path: str, chunk_ms: int) -> None:
    """Feed `path` (or stdin) to a StreamingTranscriber chunk_ms at a time; print "PATH:" and then each
    word as it is complete, on one line."""
    found = recogniser(name)
    transcriber = StreamingTranscriber(found.model, found.tokenizer, found.features, chunk_ms)
    samples = chunk_ms * found.features.sample_rate // 1000
    print(f"{path}:", end="", flush=True)
    for piece in _pieces(path, samples, found.features.sample_rate):
        for word in transcriber.accept(piece):
            print(f" {word.text}", end="", flush=True)
    for word in transcriber.finish():
        print(f" {word.text}", end="", flush=True)
    print()


def _pieces(path: str, samples: int, sample_rate: int):
    """(samples,) float pieces of stdin's raw PCM as it arrives, or of a WAV file as it is read
    (`read_audio_pieces`)."""
    if path != STDIN:
        yield from read_audio_pieces(path, sample_rate, samples)
        return
    while block := sys.stdin.buffer.read(2 * samples):
        usable = len(block) // 2 * 2
        yield torch.frombuffer(bytearray(block[:usable]), dtype=torch.int16).float() / 32768


TRANSCRIBE = Command("transcribe", "transcribe WAV files with a speech recogniser", add_arguments, run)


def add_spot_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name")
    parser.add_argument("files", nargs="+", metavar="FILE.wav")
    parser.add_argument("--top", type=int, default=3, help="keywords to show per file, most probable first")


def run_spot(args: argparse.Namespace) -> None:
    for spotted in spot_files(args.name, args.files, top_k=args.top):
        print(ranked_line(spotted.path, spotted.labels, spotted.probabilities))


SPOT = Command("spot", "the keyword of each WAV file (one second each) by a keyword spotter", add_spot_arguments,
               run_spot)
