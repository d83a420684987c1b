"""The larger training set of the shipped folding checkpoint, without the held-out families.

    make fold-data      (installs ProMod3, exports every eligible chain, then runs this)
    python -m protein.training_chains EXPORTED.npz OUT.npz

Reads a `protein/export_promod3.py` export, drops every chain at least `protein.identity.SIMILAR`
identical to a held-out chain (`protein.heldout`), and writes the rest in the same layout, so
that no held-out chain needs removing afterwards and the held-out families (trypsins, lactate
dehydrogenases, cytochromes c, ...) stay unseen. Prints how many chains were dropped.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from protein.heldout import heldout_chains
from protein.identity import SIMILAR, identity_matrix
from protein.residues import AMINO_ACIDS, UNKNOWN
from zoo.downloads import data_dir

TRAINING_CHAINS_FILE = data_dir() / "promod3_training.npz"
"""Where `make fold-data` writes the training set of the shipped checkpoint."""


def keep_dissimilar(exported: Path, out: Path, threshold: float = SIMILAR) -> tuple[int, int]:
    """Write the chains of `exported` below `threshold` identity to every held-out chain to `out`;
    returns (kept, dropped)."""
    with np.load(exported) as archive:
        data = {key: archive[key] for key in archive.files}
    ends = np.cumsum(data["lengths"])
    starts = ends - data["lengths"]
    letters = np.frombuffer((AMINO_ACIDS + UNKNOWN).encode(), dtype=np.uint8)[data["sequence"]].tobytes().decode()
    sequences = [letters[s:e] for s, e in zip(starts, ends)]
    heldout = [chain.sequence for chain in heldout_chains()]
    similar = identity_matrix(heldout, sequences).max(0) >= threshold
    kept = np.flatnonzero(~similar)
    rows = np.concatenate([np.arange(starts[k], ends[k]) for k in kept])
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial.npz")
    np.savez_compressed(partial, names=data["names"][kept], lengths=data["lengths"][kept],
                        **{key: data[key][rows] for key in ("sequence", "coordinates", "profile", "dssp")})
    partial.replace(out)
    return len(kept), int(similar.sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("exported", type=Path, help="an export of protein/export_promod3.py")
    parser.add_argument("out", type=Path, nargs="?", default=TRAINING_CHAINS_FILE)
    args = parser.parse_args()
    kept, dropped = keep_dissimilar(args.exported, args.out)
    print(f"{kept} chains kept, {dropped} dropped as >= {SIMILAR:.0%} identical to a held-out chain -> {args.out}")


if __name__ == "__main__":
    main()
