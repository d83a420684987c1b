"""`zoo fold`: predict protein backbones with a zoo folding model and write them as PDB or mmCIF.

    zoo fold fold-tiny MKTAYIAKQR -o out.pdb         one sequence (out.cif: mmCIF)
    zoo fold fold-tiny chains.fasta -o out.pdb       a FASTA file of one record
    zoo fold fold-tiny chains.fasta -o folds/        several records: folds/NAME.pdb each
                                                     (--format cif for mmCIF)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from protein.fasta import read_fasta
from protein.folding import checked_recycles, checked_sequence, fold
from protein.pdb_io import WRITTEN_FORMATS
from zoo.commands import Command
from zoo.store import load

FASTA_SUFFIXES = (".fasta", ".fa", ".faa", ".fas")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name")
    parser.add_argument("sequence", help="one-letter amino-acid sequence, or a FASTA file (.fasta, .fa, .faa, .fas)")
    parser.add_argument("-o", "--output", required=True,
                        help="file to write (.pdb or .cif); a folder when the FASTA file has several records")
    parser.add_argument("--format", choices=("pdb", "cif"), default="pdb", help="format of files written into a folder")
    parser.add_argument("--recycles", type=int, default=None, help="recycling passes (default: the model's)")


def _records(text: str) -> list[tuple[str, str]]:
    """(name, sequence) pairs of the positional argument: a FASTA file's records, or one sequence."""
    path = Path(text)
    try:
        is_file = path.is_file()
    except OSError:  # a long sequence is no file name
        is_file = False
    if path.suffix.lower() in FASTA_SUFFIXES or is_file:
        return read_fasta(path)
    return [("sequence", text)]


def _targets(records: list[tuple[str, str]], output: str, extension: str) -> list[Path]:
    """The file each record is written to (checked before any folding)."""
    target = Path(output)
    if len(records) == 1 and target.suffix.lower() in WRITTEN_FORMATS:
        if not target.resolve().parent.is_dir():
            raise ValueError(f"--output {output!r}: folder {str(target.resolve().parent)!r} does not exist")
        return [target]
    if len(records) == 1 and not target.is_dir():
        raise ValueError(f"--output must end in one of {sorted(WRITTEN_FORMATS)} or be a folder; got {output!r}")
    if target.suffix.lower() in WRITTEN_FORMATS or target.is_file():
        raise ValueError(f"--output must be a folder for {len(records)} records; got the file {output!r}")
    target.mkdir(parents=True, exist_ok=True)
    return [target / f"{name.replace('/', '_').replace('|', '_')}.{extension}" for name, _ in records]


def run(args: argparse.Namespace) -> None:
    checked_recycles(args.recycles)
    records = [(name, checked_sequence(sequence)) for name, sequence in _records(args.sequence)]
    targets = _targets(records, args.output, args.format)
    model = load(args.name)
    for (name, sequence), target in zip(records, targets):
        prediction = fold(model, sequence, recycles=args.recycles)
        prediction.write(target)
        print(f"{target}: {len(prediction.sequence)} residues, mean pLDDT {prediction.plddt.mean().item() * 100:.1f}")


FOLD = Command("fold", "predict protein backbones and write them as PDB or mmCIF", add_arguments, run)
