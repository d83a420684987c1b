"""Reading sequences from FASTA files: `>name description` header lines, each followed by its
sequence on one or more lines (blank lines and `;` comment lines ignored)."""

from __future__ import annotations

from pathlib import Path

from protein.residues import normalize_sequence


def read_fasta(path: str | Path) -> list[tuple[str, str]]:
    """(name, sequence) of every record of a FASTA file, in file order; name is the header's first
    word. ValueError naming the file and record when it has no record, a record has no sequence,
    two records share a name, or a sequence has a letter that is not an amino acid."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"FASTA file {str(path)!r} does not exist")
    records: list[tuple[str, list[str]]] = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(";"):
            continue
        if line.startswith(">"):
            name = line[1:].split(maxsplit=1)[0] if line[1:].strip() else f"record{len(records) + 1}"
            records.append((name, []))
        elif not records:
            raise ValueError(f"{path}: line {number} comes before any '>' header; a FASTA file starts with one")
        else:
            records[-1][1].append(line)
    if not records:
        raise ValueError(f"{path} holds no FASTA record (no line starts with '>')")
    names = [name for name, _ in records]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"{path}: record names must be unique; repeated: {repeated}")
    sequences = []
    for name, lines in records:
        if not "".join(lines):
            raise ValueError(f"{path}: record {name!r} has no sequence")
        try:
            sequences.append((name, normalize_sequence("".join(lines).rstrip("*"))))
        except ValueError as error:
            raise ValueError(f"{path}: record {name!r}: {error}") from None
    return sequences
