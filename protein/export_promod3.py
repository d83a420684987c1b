"""Export the shipped training chains from the ProMod3 structure database (run once, by a developer).

    apt-get install python3-promod3 promod3-data
    /usr/bin/python3 protein/export_promod3.py [--chains 2000] [--longest 256] [--out protein/assets/promod3_chains.npz]

Runs under Debian's Python (ProMod3's bindings live there), with numpy only. Reads ProMod3's
default structure database (21,119 non-redundant PDB chains, CC0), keeps chains of 30 to
`--longest` residues with no chain break (every consecutive C-N under 2 Å), takes an evenly
spaced subset of `--chains` of them in database order (0: all), and writes protein.data's npz
layout: sequences as residue ids, backbone N, CA, C, O, CB as float16 centred on each chain's
mean CA, the HHblits profile as uint8 frequencies x 255, DSSP states as ASCII.

The shipped asset is `--chains 2000 --longest 256` (12 MB). The larger training set of the shipped
checkpoint (`make fold-data`: every eligible chain up to 384 residues, held-out families removed
by `protein.training_chains`) stays out of the repository.
"""

from __future__ import annotations

import argparse

import numpy as np
from promod3 import loop

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"  # protein.residues.AMINO_ACIDS (this script runs outside the venv)
SHORTEST = 30


def chain_arrays(db, index: int, longest: int):
    """(name, ids (L,), coordinates (L, 5, 3), profile (L, 20), dssp bytes) or None when unusable."""
    info = db.GetCoordInfo(index)
    if not SHORTEST <= info.size <= longest:
        return None
    fragment = loop.FragmentInfo(index, 0, info.size)
    sequence = db.GetSequence(fragment)
    backbone = db.GetBackboneList(fragment, sequence)
    atoms = np.array([[list(getter(k)) for getter in (backbone.GetN, backbone.GetCA, backbone.GetC, backbone.GetO,
                                                       backbone.GetCB)] for k in range(len(backbone))])
    bonds = np.linalg.norm(atoms[1:, 0] - atoms[:-1, 2], axis=-1)
    if (bonds > 2.0).any():
        return None
    profile = db.GetSequenceProfile(fragment)
    frequencies = np.array([[column.GetFreq(a) for a in AMINO_ACIDS] for column in profile.columns])
    ids = np.array([AMINO_ACIDS.index(c) if c in AMINO_ACIDS else len(AMINO_ACIDS) for c in sequence], dtype=np.uint8)
    atoms -= atoms[:, 1].mean(0)
    return f"{info.id}.{info.chain_name}", ids, atoms, frequencies, db.GetDSSPStates(fragment).encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chains", type=int, default=2000, help="chains to export (0: every eligible one)")
    parser.add_argument("--longest", type=int, default=256, help="longest chain kept (residues)")
    parser.add_argument("--out", default="protein/assets/promod3_chains.npz")
    args = parser.parse_args()
    db = loop.LoadStructureDB()
    eligible = [i for i in range(db.GetNumCoords()) if SHORTEST <= db.GetCoordInfo(i).size <= args.longest]
    picked = [eligible[int(k)] for k in np.linspace(0, len(eligible) - 1, 2 * args.chains)] if args.chains else eligible
    rows = []
    for index in picked:
        arrays = chain_arrays(db, index, args.longest)
        if arrays is not None:
            rows.append(arrays)
        if len(rows) == args.chains:
            break
    names, ids, atoms, profiles, dssp = zip(*rows)
    np.savez_compressed(
        args.out, names=np.array(names), lengths=np.array([len(s) for s in ids], dtype=np.int32),
        sequence=np.concatenate(ids), coordinates=np.concatenate(atoms).astype(np.float16),
        profile=np.round(np.concatenate(profiles) * 255).clip(0, 255).astype(np.uint8),
        dssp=np.frombuffer(b"".join(dssp), dtype=np.uint8))
    print(f"{len(rows)} chains, {sum(len(s) for s in ids)} residues of {len(eligible)} eligible -> {args.out}")


if __name__ == "__main__":
    main()
