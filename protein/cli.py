"""`zoo fold`: predict a protein backbone with a zoo folding model and write it as PDB."""

from __future__ import annotations

import argparse
from pathlib import Path

from protein.folding import fold
from zoo.commands import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name")
    parser.add_argument("sequence", help="one-letter amino-acid sequence")
    parser.add_argument("-o", "--output", required=True, help="PDB file to write")
    parser.add_argument("--recycles", type=int, default=None, help="recycling passes (default: the model's)")


def run(args: argparse.Namespace) -> None:
    folder = Path(args.output).resolve().parent
    if not folder.is_dir():
        raise ValueError(f"--output {args.output!r}: folder {str(folder)!r} does not exist")
    prediction = fold(args.name, args.sequence, recycles=args.recycles)
    prediction.write_pdb(args.output)
    print(f"{args.output}: {len(prediction.sequence)} residues, mean pLDDT {prediction.plddt.mean().item() * 100:.1f}")


FOLD = Command("fold", "predict a protein backbone and write it as PDB", add_arguments, run)
