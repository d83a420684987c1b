"""`zoo generate`: continue a prompt with a zoo language model."""

from __future__ import annotations

import argparse

from nlp.generate import generate_text
from zoo.commands import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name")
    parser.add_argument("prompt")
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> None:
    print(generate_text(args.name, args.prompt, max_new_tokens=args.tokens, temperature=args.temperature,
                        top_k=args.top_k, top_p=args.top_p, seed=args.seed))


GENERATE = Command("generate", "continue a prompt with a language model", add_arguments, run)
