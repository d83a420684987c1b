"""How well each confidence tracks the true per-residue lDDT-Cα of the fold `protein.fold` writes (the
Cα trace realised from the distogram), on chains of the shipped ProMod3 set's validation split (never
trained on), folded from the sequence alone: the pLDDT `fold` writes (the model's confidence readout,
protein.confidence_readout), the pLDDT head (trained on the structure module's backbone) and the
distogram's expected lDDT (protein.confidence) at several temperatures. Pearson r over all residues
pooled, and its median per chain.

    python benchmarks/fold_confidence.py [MODEL] [--chains 30] [--threads 2]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from protein.confidence import TEMPERATURE, distogram_lddt  # noqa: E402
from protein.evaluation import pearson  # noqa: E402
from protein.folding import fold  # noqa: E402
from protein.metrics import lddt  # noqa: E402
from validation_folds import model_and_chains  # noqa: E402

TEMPERATURES = (0.3, 0.5, TEMPERATURE, 1.0, 1.5, 2.0)


def main() -> None:
    model, chains, args = model_and_chains(__doc__, 30)
    logits: dict[str, torch.Tensor] = {}
    model.register_forward_hook(lambda _m, _i, out: logits.__setitem__("last", out["distogram_logits"][0]))
    started = time.perf_counter()
    folds = []
    for chain in chains:
        prediction = fold(model, chain.sequence)
        true = lddt(prediction.backbone[:, 1], chain.coordinates[:, 1], per_residue=True).float()
        folds.append((prediction, logits["last"], true))
    print(f"{args.model}: {len(chains)} validation chains ({statistics.fmean(len(c.sequence) for c in chains):.0f} "
          f"residues on average) folded from the sequence alone and realised in {time.perf_counter() - started:.0f} s; "
          f"mean lDDT-Cα of the realised folds {statistics.fmean(t.mean().item() for _, _, t in folds):.3f}\n")
    print("| confidence | Pearson r, all residues | median r per chain | mean confidence |\n|---|---|---|---|")
    _row("the model's confidence readout (fold's pLDDT)", [(p.plddt, t) for p, _, t in folds])
    _row("pLDDT head (learnt on the structure module's backbone)", [(p.module_plddt, t) for p, _, t in folds])
    for temperature in TEMPERATURES:
        default = " (default)" if temperature == TEMPERATURE else ""
        _row(f"distogram's expected lDDT, temperature {temperature}{default}",
             [(distogram_lddt(g, p.backbone[:, 1], temperature), t) for p, g, t in folds])


def _row(name: str, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    confidence, true = torch.cat([c for c, _ in pairs]), torch.cat([t for _, t in pairs])
    per_chain = statistics.median(pearson(c, t) for c, t in pairs)
    print(f"| {name} | {pearson(confidence, true):.3f} | {per_chain:.3f} | {confidence.mean().item():.3f} |")


if __name__ == "__main__":
    main()
