"""Reading protein chains from PDB and mmCIF files (through gemmi) and writing predictions as PDB or mmCIF.

A chain is read from the first model. Residues are the chain's polymer (waters and ligands are
dropped). Non-standard amino acids that gemmi tabulates with a parent (MSE selenomethionine,
SEP phosphoserine, ...) take their parent's letter; other residues of the polymer become X.
Missing atoms are left out of `atom_mask`; glycine has no CB. Chain breaks are kept as they are:
`chain_breaks` finds them (peptide C-N bond over 2 Å or an atom of it missing), and
`residue_index` keeps the author numbering, so a gap in numbering stays a gap in relative positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from protein.residues import AMINO_ACIDS, UNKNOWN, normalize_sequence
from zoo.downloads import write_atomically

BACKBONE_ATOMS = ("N", "CA", "C", "O", "CB")
"""Atoms kept per residue, in this order."""
WRITTEN_FORMATS = {".pdb": "pdb", ".ent": "pdb", ".cif": "mmcif", ".mmcif": "mmcif"}
"""File suffix -> format `write_structure` writes."""
PEPTIDE_BOND_LIMIT = 2.0
"""Å: a longer C(i)-N(i+1) distance is a chain break (the bond is 1.33 Å)."""


@dataclass
class Chain:
    """One protein chain."""

    name: str
    """Chain name in the file."""
    sequence: str
    """One letter per residue (X: unknown or untabulated non-standard)."""
    coordinates: torch.Tensor
    """(L, 5, 3) float32 Å: N, CA, C, O, CB; zeros where missing."""
    atom_mask: torch.Tensor
    """(L, 5) bool: the atom is present."""
    residue_index: torch.Tensor
    """(L,) long author residue numbers."""


def _letter(residue_name: str) -> str:
    import gemmi

    info = gemmi.find_tabulated_residue(residue_name)
    letter = info.one_letter_code.upper() if info is not None and info.is_amino_acid() else UNKNOWN
    return letter if letter in AMINO_ACIDS else UNKNOWN


def read_chain(path: str | Path, chain: str | None = None, model: int = 0) -> Chain:
    """Chain `chain` (None: the first with an amino-acid polymer) of model number `model` (0: the
    first; NMR files hold several) of a PDB or mmCIF file (gzipped or not)."""
    structure, proteins = _protein_polymers(path, model)
    name = chain if chain is not None else next(iter(proteins))
    if name not in proteins:
        raise ValueError(f"chain must be one of the protein chains {list(proteins)} of {path}; got {chain!r}")
    return _chain(name, proteins[name])


def read_chains(path: str | Path, model: int = 0) -> list[Chain]:
    """Every protein chain of model number `model` of a PDB or mmCIF file, in file order, from one
    parse of the file (reading each chain with `read_chain` parses the file once per chain)."""
    structure, proteins = _protein_polymers(path, model)
    return [_chain(name, residues) for name, residues in proteins.items()]


def _protein_polymers(path: str | Path, model: int):
    """(the parsed structure, {chain name: its polymer} of the chains with amino acids in model
    `model`); the polymers are views into the structure, which must outlive them."""
    import gemmi

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"structure file {str(path)!r} does not exist")
    try:
        structure = gemmi.read_structure(str(path))
    except (RuntimeError, ValueError) as error:
        raise ValueError(f"{path} is not a readable PDB or mmCIF file: {error}") from None
    if not 0 <= model < len(structure):
        raise ValueError(f"model must be in [0, {len(structure)}) for {path}; got {model}")
    structure.setup_entities()
    proteins = {c.name: c.get_polymer() for c in structure[model]
                if any(gemmi.find_tabulated_residue(r.name) is not None and gemmi.find_tabulated_residue(r.name).is_amino_acid()
                       for r in c.get_polymer())}
    if not proteins:
        raise ValueError(f"{path} has no protein chain; its chains: {[c.name for c in structure[model]]}")
    return structure, proteins


def _chain(name: str, residues) -> Chain:
    """Chain `name` of its polymer `residues` (a gemmi ResidueSpan)."""
    # Collected in lists and made into tensors once, rather than one tensor write per atom.
    positions, present = [], []
    for residue in residues:
        for atom_name in BACKBONE_ATOMS:
            atom = residue.find_atom(atom_name, "*")
            present.append(atom is not None)
            positions.append((atom.pos.x, atom.pos.y, atom.pos.z) if atom is not None else (0.0, 0.0, 0.0))
    shape = (len(residues), len(BACKBONE_ATOMS))
    return Chain(name=name, sequence="".join(_letter(r.name) for r in residues),
                 coordinates=torch.tensor(positions, dtype=torch.float32).reshape(*shape, 3),
                 atom_mask=torch.tensor(present, dtype=torch.bool).reshape(shape),
                 residue_index=torch.tensor([r.seqid.num for r in residues], dtype=torch.long))


def chain_breaks(coordinates: torch.Tensor, atom_mask: torch.Tensor) -> torch.Tensor:
    """(L-1,) bool: no peptide bond between residue i and i+1 (C-N over 2 Å, or C or N missing);
    coordinates (L, A, 3) and atom_mask (L, A) in BACKBONE_ATOMS order."""
    carbon, nitrogen = BACKBONE_ATOMS.index("C"), BACKBONE_ATOMS.index("N")
    length = (coordinates[1:, nitrogen] - coordinates[:-1, carbon]).norm(dim=-1)
    return (length > PEPTIDE_BOND_LIMIT) | ~atom_mask[:-1, carbon] | ~atom_mask[1:, nitrogen]


def write_structure(path: str | Path, sequence: str, coordinates: torch.Tensor, atom_mask: torch.Tensor | None = None,
                    b_factors: torch.Tensor | None = None, chain: str = "A") -> None:
    """Write one chain (atomically) as PDB or as mmCIF, by the file's suffix (`WRITTEN_FORMATS`):
    sequence of L letters, coordinates (L, A, 3) Å with A <= 5 atoms in BACKBONE_ATOMS order,
    atom_mask (L, A) (None: all present; CB is never written for glycine), b_factors (L,) (e.g.
    pLDDT x 100; None: 0)."""
    import gemmi

    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in WRITTEN_FORMATS:
        raise ValueError(f"path must end in one of {sorted(WRITTEN_FORMATS)} (the format to write); got {str(path)!r}")
    sequence = normalize_sequence(sequence)
    if coordinates.ndim != 3 or coordinates.shape[0] != len(sequence) or not 1 <= coordinates.shape[1] <= 5 \
            or coordinates.shape[2] != 3:
        raise ValueError(f"coordinates must be (L={len(sequence)}, A<=5, 3); got {tuple(coordinates.shape)}")
    mask = torch.ones(coordinates.shape[:2], dtype=torch.bool) if atom_mask is None else atom_mask.bool().cpu()
    if mask.shape != coordinates.shape[:2]:
        raise ValueError(f"atom_mask must be {tuple(coordinates.shape[:2])}; got {tuple(mask.shape)}")
    b_factors = torch.zeros(len(sequence)) if b_factors is None else b_factors.detach().float().cpu()
    if b_factors.shape != (len(sequence),):
        raise ValueError(f"b_factors must be ({len(sequence)},); got {tuple(b_factors.shape)}")
    model, written = gemmi.Model("1"), gemmi.Chain(chain)
    serial = 0
    for i, (letter, xyz) in enumerate(zip(sequence, coordinates.detach().double().cpu().tolist())):
        residue = gemmi.Residue()
        residue.name = gemmi.expand_one_letter(letter, gemmi.ResidueKind.AA) or "UNK"
        residue.seqid = gemmi.SeqId(i + 1, " ")
        for j, atom_name in enumerate(BACKBONE_ATOMS[: coordinates.shape[1]]):
            if not mask[i, j] or (atom_name == "CB" and letter == "G"):
                continue
            serial += 1
            atom = gemmi.Atom()
            atom.name, atom.element, atom.serial = atom_name, gemmi.Element(atom_name[0]), serial
            atom.pos, atom.occ, atom.b_iso = gemmi.Position(*xyz[j]), 1.0, float(b_factors[i])
            residue.add_atom(atom)
        written.add_residue(residue)
    model.add_chain(written)
    structure = gemmi.Structure()
    structure.add_model(model)
    structure.setup_entities()
    if WRITTEN_FORMATS[suffix] == "pdb":
        text = structure.make_pdb_string(gemmi.PdbWriteOptions(cryst1_record=False))
    else:
        structure.name = path.stem
        text = structure.make_mmcif_document().as_string()
    write_atomically(path, text)
