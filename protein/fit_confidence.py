"""Fitting what a folding model's confidence is read from after the model is trained: the burial
network (`protein.burial`) on the training chains' true structures, then the confidence readout
(`protein.confidence_readout`) on realised folds of validation chains that nothing else reads.

    python -m protein.fit_confidence MODEL [--chains-file FILE] [--burial-epochs 6] [--chains 200]
                                     [--output DIR] [--threads 2]

trains the burial network on the chains file's training split (no fold needed; --burial-epochs 0
keeps the model's own), folds each fitting chain from the sequence alone (`protein.fold`,
realised), fits the readout to the folds' true per-residue lDDT-Cα, and writes the model (to
MODEL's own folder unless --output) with a line in its card. The chains (`fitting_chains`) are
validation chains past the first `SCORED_CHAINS` (the recipe `fold_tiny` scores those) and none
of `benchmark_chains` (the folding benchmarks read those), so no figure reported elsewhere is of a
fitted chain.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import zoo
from protein.burial import BurialTraining, neighbour_counts, train_burial
from protein.data import CHAINS_FILE, ProteinChain, load_chains
from protein.evaluation import pearson
from protein.folding import fold
from protein.metrics import lddt
from protein.model import FoldingModel
from zoo.model_folder import CARD_FILE, CONFIG_FILE, WEIGHTS_FILE
from zoo.store import load, locate, read_config

SCORED_CHAINS = 24
"""The recipe fold_tiny's default `evaluation_chains`: the first this many validation chains are scored."""
CARD_LINE = "- Confidence readout fitted"
"""How the card's line about the fit begins (a refit replaces it)."""


def benchmark_chains() -> list[ProteinChain]:
    """Every other validation chain of the shipped set, the first first: what the benchmarks that fold
    validation chains read (benchmarks/validation_folds.py)."""
    return load_chains("validation")[::2]


def fitting_chains(path: Path, count: int, skip: int = SCORED_CHAINS) -> list[ProteinChain]:
    """Up to `count` validation chains of the chains file `path`, past its first `skip` and none of
    benchmark_chains(); ValueError when none is left."""
    if count < 1:
        raise ValueError(f"count must be >= 1; got {count}")
    read_elsewhere = {chain.sequence for chain in benchmark_chains()}
    chains = [chain for chain in load_chains("validation", path)[skip:] if chain.sequence not in read_elsewhere][:count]
    if not chains:
        raise ValueError(f"no validation chain of {str(path)!r} is left to fit on past the first {skip}")
    return chains


def fit_burial(model: FoldingModel, training_chains: list[ProteinChain], epochs: int,
               fitting: list[ProteinChain]) -> dict[str, float]:
    """Train model.burial on the training chains for `epochs` -> {"burial_chains", "burial_epochs",
    "burial_loss" (the last epoch's mean squared error), "burial_pearson" (predicted against true
    log(1 + neighbours within 15 Å) over the `fitting` chains' residues, which it never trained on)}."""
    losses = train_burial(model.burial, training_chains, BurialTraining(epochs=epochs))
    predicted = torch.cat([model.burial.predict(chain.sequence)[:, 0].cpu() for chain in fitting])
    true = torch.cat([neighbour_counts(chain.coordinates[:, 1])[:, 0] for chain in fitting])
    return {"burial_chains": len(training_chains), "burial_epochs": epochs, "burial_loss": round(losses[-1], 4),
            "burial_pearson": round(pearson(predicted, true), 4)}


def readout_example(model: FoldingModel, chain: ProteinChain) -> tuple[torch.Tensor, torch.Tensor]:
    """The chain folded from its sequence and realised -> (features (L, F) the readout reads, true
    lDDT-Cα (L,) of the realised fold)."""
    prediction = fold(model, chain.sequence)
    return prediction.confidence_features, lddt(prediction.backbone[:, 1], chain.coordinates[:, 1],
                                                 per_residue=True).float()


def fit_readout(model: FoldingModel, examples: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """Fit model.confidence_readout on the examples (readout_example's) -> {"chains", "residues",
    "pearson_before" (the unfitted readout's r on these residues), "pearson_fitted"}."""
    features = torch.cat([f for f, _ in examples])
    targets = torch.cat([t for _, t in examples])
    before = pearson(features[:, 0], targets)
    model.confidence_readout.fit(features, targets)
    return {"chains": len(examples), "residues": len(targets), "pearson_before": round(before, 4),
            "pearson_fitted": round(pearson(model.confidence_readout(features), targets), 4)}


def card_line(stats: dict[str, float], command: str) -> str:
    """The model card's line about the fit (fit_readout's stats, with fit_burial's when the burial
    network was trained)."""
    epochs = stats.get("burial_epochs", 0)
    burial = (f"; burial network (`protein.burial`) trained on {stats['burial_chains']:,} training chains for {epochs} "
              f"epoch{'s' if epochs != 1 else ''}, its predicted neighbour count at Pearson r "
              f"{stats['burial_pearson']:.3f} with the true one on those validation chains" if "burial_chains" in stats else "")
    return (f"{CARD_LINE} (`protein.confidence_readout`) on realised folds of {stats['chains']} validation chains "
            f"({stats['residues']:,} residues) that no reported figure reads: `{command}`; Pearson r with their "
            f"true lDDT-Cα {stats['pearson_before']:.3f} unfitted, {stats['pearson_fitted']:.3f} fitted{burial}.")


def with_card_line(card: str, line: str) -> str:
    """The card with `line` after its "- Made by:" item (and that item's indented continuation), or
    before its first "## " section when it has none, replacing any earlier line about a fit."""
    lines = [kept for kept in card.rstrip("\n").splitlines() if not kept.startswith(CARD_LINE)]
    made_by = next((i for i, kept in enumerate(lines) if kept.startswith("- Made by:")), None)
    if made_by is not None:
        at = made_by + 1
        while at < len(lines) and lines[at].startswith("  "):
            at += 1
    else:
        at = next((i for i, kept in enumerate(lines) if kept.startswith("## ")), len(lines))
        while at > 0 and not lines[at - 1].strip():
            at -= 1
    return "\n".join([*lines[:at], line, *lines[at:]]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a zoo name or model folder of a folding model")
    parser.add_argument("--chains-file", default=str(CHAINS_FILE), help="chains (npz) whose validation split is read")
    parser.add_argument("--burial-epochs", type=int, default=BurialTraining.epochs,
                        help="epochs of the burial network over the training split (0: keep the model's)")
    parser.add_argument("--chains", type=int, default=200, help="validation chains to fit the readout on")
    parser.add_argument("--output", help="model folder to write (default: the model's own)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.burial_epochs < 0:
        raise SystemExit(f"--burial-epochs must be >= 0; got {args.burial_epochs}")
    # What this command fits is not read from the folder, so a model saved before it existed loads.
    model = load(args.model, refit=("burial.", "confidence_readout.") if args.burial_epochs else ("confidence_readout.",))
    if not isinstance(model, FoldingModel):
        raise SystemExit(f"model must be a folding model; {args.model!r} is a {type(model).__name__}")
    folder = locate(args.model)
    chains = fitting_chains(Path(args.chains_file), args.chains)
    started = time.perf_counter()
    burial = {}
    if args.burial_epochs:
        burial = fit_burial(model, load_chains("train", Path(args.chains_file)), args.burial_epochs, chains)
        print(f"burial network: {burial} after {time.perf_counter() - started:.0f} s", flush=True)
    examples = []
    for index, chain in enumerate(chains):
        examples.append(readout_example(model, chain))
        print(f"  {index + 1}/{len(chains)} {chain.name} L={len(chain.sequence)}", flush=True)
    stats = fit_readout(model, examples) | burial
    print(f"fitted on {stats['chains']} chains, {stats['residues']} residues in {time.perf_counter() - started:.0f} s: "
          f"Pearson r {stats['pearson_before']} unfitted, {stats['pearson_fitted']} fitted")
    command = (f"python -m protein.fit_confidence {args.model} --chains-file {Path(args.chains_file).name} "
               f"--burial-epochs {args.burial_epochs} --chains {args.chains}")
    card = (folder / CARD_FILE).read_text() if (folder / CARD_FILE).exists() else f"# {folder.name}\n"
    output = Path(args.output) if args.output else folder
    zoo.save(model, output, card=with_card_line(card, card_line(stats, command)),
             extra={k: v for k, v in read_config(folder).items() if k not in ("arch", "config")},
             files={p.name: p.read_bytes() for p in folder.iterdir()
                    if p.is_file() and p.name not in (CARD_FILE, CONFIG_FILE, WEIGHTS_FILE)})
    print(f"saved {output}")


if __name__ == "__main__":
    main()
