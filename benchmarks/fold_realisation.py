"""How far a folding model's structure module draws the chain in, and what realising its Cα trace
from the distogram (protein.realisation) gives, on chains of the shipped ProMod3 set's validation
split (never trained on), folded from the sequence alone: the consecutive Cα step, the ratio of
predicted to true distances by sequence separation, and mean lDDT-Cα / TM-score of the structure
module's fold, of the ideal helix (the best trivial baseline) and of realisations at several
settings (the defaults first).

    python benchmarks/fold_realisation.py [MODEL] [--chains 40] [--threads 2]
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from protein.data import load_chains  # noqa: E402
from protein.evaluation import baseline_predictors  # noqa: E402
from protein.folding import fold  # noqa: E402
from protein.metrics import lddt, tm_score  # noqa: E402
from protein.realisation import RealisationConfig, realise  # noqa: E402
from validation_folds import model_and_chains  # noqa: E402

SEPARATIONS = (1, 2, 4, 8, 16)
DEFAULT = RealisationConfig()
SETTINGS = [DEFAULT] + [dataclasses.replace(DEFAULT, steps=s) for s in (200, 800)] + [
    dataclasses.replace(DEFAULT, max_distance=d) for d in (12.0, 18.0, 21.0)] + [
    dataclasses.replace(DEFAULT, bond_weight=w) for w in (1.0, 100.0)]


def main() -> None:
    model, chains, args = model_and_chains(__doc__, 40)
    helix = baseline_predictors(load_chains("train"))["ideal_helix"]
    started = time.perf_counter()
    folds = [(chain, fold(model, chain.sequence, realisation=None)) for chain in chains]
    print(f"{args.model}: {len(chains)} validation chains ({statistics.fmean(len(c.sequence) for c in chains):.0f} "
          f"residues on average) folded from the sequence alone in {time.perf_counter() - started:.0f} s\n")
    steps = torch.cat([(p.backbone[1:, 1] - p.backbone[:-1, 1]).norm(dim=-1) for _, p in folds])
    ratios = {k: statistics.fmean((torch.cdist(p.backbone[:, 1], p.backbone[:, 1]).diagonal(k).mean() /
                                   torch.cdist(c.coordinates[:, 1], c.coordinates[:, 1]).diagonal(k).mean()).item()
                                  for c, p in folds if len(c.sequence) > k) for k in SEPARATIONS}
    print(f"structure module: consecutive Cα {steps.mean():.2f} ± {steps.std():.2f} Å (true 3.80); predicted / true "
          "distance at separation " + ", ".join(f"{k}: {r:.2f}" for k, r in ratios.items()) + "\n")
    print("| fold | lDDT-Cα | TM-score | seconds |\n|---|---|---|---|")
    _row("structure module", [(c, p.backbone[:, 1]) for c, p in folds], 0.0)
    _row("ideal helix", [(c, helix(c.sequence)) for c, _ in folds], 0.0)
    for config in SETTINGS:
        started = time.perf_counter()
        realised = [(c, realise(p.backbone[:, 1], p.distances, config)) for c, p in folds]
        name = (f"realised, {config.steps} steps, max_distance {config.max_distance:g} Å, bond_weight "
                f"{config.bond_weight:g}" + (" (default)" if config == DEFAULT else ""))
        _row(name, realised, time.perf_counter() - started)


def _row(name: str, folds: list, seconds: float) -> None:
    scores = [(lddt(ca.float(), c.coordinates[:, 1]).item(), tm_score(ca.float(), c.coordinates[:, 1]).item())
              for c, ca in folds]
    print(f"| {name} | {statistics.fmean(s[0] for s in scores):.4f} | {statistics.fmean(s[1] for s in scores):.4f} | "
          f"{seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
