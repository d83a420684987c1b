"""The trivial structure predictors a folding model has to beat (protein.baselines), scored on
chains of the shipped ProMod3 set that training never sees: the extended chain, one ideal α-helix,
and the states predicted from sequence propensities placed with ideal geometry (the geometry and
propensities measured on the training split). Mean lDDT-Cα, TM-score and GDT-TS per split, the
three-state accuracy (Q3) of the propensity predictor, and with --per-chain every chain's row.

    python benchmarks/fold_baselines.py [--splits validation test] [--chains 0] [--per-chain]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from protein.baselines import (Propensities, StateGeometry, extended_chain,  # noqa: E402
                               ideal_helix, propensity_structure)
from protein.secondary_structure import STATES, three_states  # noqa: E402
from protein.data import load_chains  # noqa: E402
from protein.metrics import gdt_ts, lddt, tm_score  # noqa: E402

METRICS = {"lDDT-Cα": lddt, "TM-score": tm_score, "GDT-TS": gdt_ts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--splits", nargs="+", default=["validation", "test"], choices=["validation", "test"])
    parser.add_argument("--chains", type=int, default=0, help="the first this many chains of each split (0: all)")
    parser.add_argument("--per-chain", action="store_true", help="also print every chain's scores")
    args = parser.parse_args()
    started = time.perf_counter()
    train = load_chains("train")
    geometry = StateGeometry.measure([(c.coordinates[:, 1], three_states(c.dssp)) for c in train])
    propensities = Propensities.measure([(c.sequence, three_states(c.dssp)) for c in train])
    print(f"measured on {len(train)} training chains in {time.perf_counter() - started:.1f} s")
    print("Cα bond angle / dihedral per state: " + ", ".join(
        f"{state} {math.degrees(geometry.angle[state]):.1f}° / {math.degrees(geometry.dihedral[state]):+.1f}°"
        for state in STATES))
    helix = ideal_helix(24, geometry).double()
    print(f"ideal helix: Cα i to i+3 {(helix[3:] - helix[:-3]).norm(dim=-1).mean():.2f} Å, "
          f"i to i+4 {(helix[4:] - helix[:-4]).norm(dim=-1).mean():.2f} Å")
    builders = {"extended chain": lambda c: extended_chain(len(c.sequence)),
                "ideal helix": lambda c: ideal_helix(len(c.sequence), geometry),
                "propensity states": lambda c: propensity_structure(c.sequence, propensities, geometry)}
    for split in args.splits:
        chains = load_chains(split)[:args.chains or None]
        truth = [three_states(c.dssp) for c in chains]
        predicted = [propensities.predict(c.sequence) for c in chains]
        q3 = [sum(a == b for a, b in zip(t, p)) / len(t) for t, p in zip(truth, predicted)]
        scores = {name: {metric: [score(build(c), c.coordinates[:, 1]).item() for c in chains]
                         for metric, score in METRICS.items()} for name, build in builders.items()}
        print(f"\n{split}: {len(chains)} chains, {sum(map(len, truth))} residues; propensity Q3 per chain "
              f"mean {statistics.mean(q3):.3f} (median {statistics.median(q3):.3f})\n")
        print("| baseline | " + " | ".join(METRICS) + " |")
        print("|---" * (len(METRICS) + 1) + "|")
        for name, values in scores.items():
            print(f"| {name} | " + " | ".join(f"{statistics.mean(v):.3f}" for v in values.values()) + " |")
        if args.per_chain:
            print("\n| chain | length | " + " | ".join(f"{name} lDDT" for name in builders) + " | Q3 |")
            print("|---" * (len(builders) + 3) + "|")
            for index, chain in enumerate(chains):
                cells = " | ".join(f"{scores[name]['lDDT-Cα'][index]:.3f}" for name in builders)
                print(f"| {chain.name} | {len(chain.sequence)} | {cells} | {q3[index]:.3f} |")
    print(f"\n{time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()
