"""`zoo classify`: label image files with a zoo image classifier."""

from __future__ import annotations

import argparse

from vision.classify import classify_files
from zoo.commands import Command, ranked_line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name")
    parser.add_argument("images", nargs="+", metavar="IMAGE")
    parser.add_argument("--top", type=int, default=3, help="classes to show per image, most probable first")


def run(args: argparse.Namespace) -> None:
    for prediction in classify_files(args.name, args.images, top_k=args.top):
        print(ranked_line(prediction.path, prediction.labels, prediction.probabilities))


CLASSIFY = Command("classify", "label images with an image classifier", add_arguments, run)
