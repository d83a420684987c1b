"""`zoo translate`: translate a text, or a file line by line, with a zoo translator."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nlp.translation.decode import BeamSettings
from nlp.translation.translate import load_translator, translate
from zoo.commands import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help='a zoo translator\'s name or folder, or its language pair ("zh-en")')
    parser.add_argument("text", help="the text to translate, or a file whose lines are translated one by one "
                                     "(blank lines stay blank)")
    parser.add_argument("--beams", type=int, default=4, help="beam size (1: greedy)")
    parser.add_argument("--length-penalty", type=float, default=1.0)
    parser.add_argument("--max-length-ratio", type=float, default=3.0,
                        help="most target tokens per source token")
    parser.add_argument("--batch-size", type=int, default=16, help="lines decoded together")
    parser.add_argument("--device", default="cpu")


def run(args: argparse.Namespace) -> None:
    path = Path(args.text)
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else [args.text]
    model, tokenizer = load_translator(args.model, args.device)
    settings = BeamSettings(beams=args.beams, length_penalty=args.length_penalty,
                            max_length_ratio=args.max_length_ratio)
    written = [i for i, line in enumerate(lines) if line.strip()] if path.is_file() else [0]
    translations = dict(zip(written, translate(model, tokenizer, [lines[i] for i in written], settings,
                                               args.batch_size)))
    sys.stdout.write("".join(translations.get(i, "") + "\n" for i in range(len(lines))))


TRANSLATE = Command("translate", "translate a text or a file's lines with a translator", add_arguments, run)
