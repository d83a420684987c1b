"""Fitting what a folding model's confidence is read from after the model is trained: the burial
network (`protein.burial`) on the training chains' true structures, then the per-pair network
(`protein.pair_confidence`) and the confidence readout (`protein.confidence_readout`) on realised
folds of validation chains that nothing else reads.

    python -m protein.fit_confidence MODEL [--chains-file FILE] [--burial-epochs 6] [--chains 200]
                                     [--folds DIR] [--output DIR] [--threads 2]

trains the burial network on the chains file's training split (no fold needed; --burial-epochs 0
keeps the model's own), folds each fitting chain from the sequence alone (`protein.fold`,
realised) into --folds (a fold already there, of the same model, is read instead: folding is the
costly part of a fit, some 3 s a chain on 2 cores), trains the per-pair network on pairs drawn from
the folds, fits the readout to the folds' true per-residue lDDT-Cα, and writes the model (to
MODEL's own folder unless --output) with a line in its card. The chains (`fitting_chains`) are
validation chains past the first `SCORED_CHAINS` (the recipe `fold_tiny` scores those) and none
of `benchmark_chains` (the folding benchmarks read those), so no figure reported elsewhere is of a
fitted chain.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

import zoo
from protein.burial import BurialTraining, neighbour_counts, train_burial
from protein.data import CHAINS_FILE, ProteinChain, load_chains
from protein.evaluation import pearson
from protein.folding import fold
from protein.metrics import lddt
from protein.model import FoldingModel
from protein.confidence_readout import FEATURES
from protein.pair_confidence import RESIDUE_FEATURES, PairTraining, pair_examples, train_pair_confidence
from zoo.model_folder import CARD_FILE, CONFIG_FILE, WEIGHTS_FILE
from zoo.store import load, locate, read_config

SCORED_CHAINS = 24
"""The recipe fold_tiny's default `evaluation_chains`: the first this many validation chains are scored."""
CARD_LINE = "- Confidence readout fitted"
"""How the card's line about the fit begins (a refit replaces it)."""
FITTED = ("confidence_readout.",)
"""Prefixes of the weights this fit sets (with "burial." when it trains the burial network)."""


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


@dataclass
class FittingFold:
    """A fitting chain folded from its sequence and realised: what the fit reads of it."""

    sequence: str
    """The folded sequence (normalised)."""
    logits: torch.Tensor
    """(L, L, bins) float32: the distogram head's logits."""
    ca: torch.Tensor
    """(L, 3) float32 Å: the realised Cα trace."""
    module_plddt: torch.Tensor
    """(L,) float32: the pLDDT head's estimate for the structure module's backbone."""
    true_ca: torch.Tensor
    """(L, 3) float32 Å: the chain's true Cα."""
    model: str
    """fold_digest of the model that folded it."""


def fold_digest(model: FoldingModel) -> str:
    """SHA-256 (hex) of the model's configuration and of every weight the fold depends on (all but
    FITTED and the burial network's), so a fold of another model is never read as this one's."""
    digest = hashlib.sha256(repr(model.config).encode())
    for name, value in sorted(model.state_dict().items()):
        if not name.startswith((*FITTED, "burial.")):
            digest.update(name.encode())
            digest.update(value.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def fitting_fold(model: FoldingModel, chain: ProteinChain, digest: str) -> FittingFold:
    """The chain folded from its sequence and realised (protein.fold) by the model of fold_digest `digest`."""
    prediction = fold(model, chain.sequence, keep_logits=True)
    return FittingFold(prediction.sequence, prediction.distogram_logits, prediction.backbone[:, 1].clone(),
                       prediction.module_plddt, chain.coordinates[:, 1].clone(), digest)


def read_fold(path: Path) -> FittingFold:
    """A FittingFold written by stored_fold."""
    return FittingFold(**torch.load(path, weights_only=True))


def stored_fold(model: FoldingModel, chain: ProteinChain, digest: str, folder: Path) -> Path:
    """The file in `folder` that holds the chain's FittingFold by this model (fold_digest `digest`),
    folded and written there unless one already is."""
    path = folder / f"{chain.name}.pt"
    if path.exists():
        kept = read_fold(path)
        if kept.model == digest and kept.sequence == chain.sequence:
            return path
    partial = path.with_suffix(".partial")
    torch.save(asdict(fitting_fold(model, chain, digest)), partial)
    partial.replace(path)  # atomic: an interrupted fit leaves no half-written fold
    return path


def pair_sample(model: FoldingModel, folded: FittingFold, training: PairTraining, index: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """pair_examples of fitting chain `index`'s fold with the model's burial prediction, drawn with a
    generator seeded by the training's seed and the index (the same draw whichever rank or run makes it)."""
    generator = torch.Generator().manual_seed(training.seed * 1_000_003 + index)
    return pair_examples(folded.logits, folded.ca, folded.true_ca, model.burial.predict(folded.sequence).cpu(),
                         training.pairs_per_chain, generator)


def fit_pairs(model: FoldingModel, examples: list[tuple[torch.Tensor, torch.Tensor]], training: PairTraining
              ) -> dict[str, float]:
    """Train model.confidence_readout.pairs on the examples (pair_sample's) -> {"pair_examples",
    "pair_epochs", "pair_loss" (the last epoch's binary cross-entropy)}."""
    losses = train_pair_confidence(model.confidence_readout.pairs, examples, training)
    return {"pair_examples": sum(len(targets) for _, targets in examples), "pair_epochs": training.epochs,
            "pair_loss": round(losses[-1], 4)}


def readout_example(model: FoldingModel, folded: FittingFold) -> tuple[torch.Tensor, torch.Tensor]:
    """A fitting fold -> (features (L, F) the readout reads, as protein.fold computes them with the
    model's burial and per-pair networks on the model's device, true lDDT-Cα (L,) of the realised fold)."""
    device = model.confidence_readout.pairs.mean.device
    features = model.confidence_readout.features(folded.logits.to(device), folded.ca.to(device), folded.sequence,
                                                 folded.module_plddt.to(device), model.burial.predict(folded.sequence))
    return features.cpu(), lddt(folded.ca, folded.true_ca, per_residue=True).float()


def fit_readout(model: FoldingModel, examples: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """Fit model.confidence_readout on the examples (readout_example's) -> {"chains", "residues",
    "pearson_before" (the unfitted readout's r on these residues), "pearson_fitted"}."""
    features = torch.cat([f for f, _ in examples])
    targets = torch.cat([t for _, t in examples])
    before = pearson(features[:, 0], targets)
    model.confidence_readout.fit(features, targets)
    return {"chains": len(examples), "residues": len(targets), "pearson_before": round(before, 4),
            "pearson_fitted": round(pearson(model.confidence_readout(features), targets), 4)}


def fit_folds(model: FoldingModel, paths: list[Path], samples: list[tuple[torch.Tensor, torch.Tensor]],
              training: PairTraining) -> dict[str, float]:
    """Train the per-pair network on `samples` (pair_sample's, one per fold), then fit the readout
    on the folds kept at `paths` (stored_fold's) -> fit_readout's stats | fit_pairs'."""
    pairs = fit_pairs(model, samples, training)
    return fit_readout(model, [readout_example(model, read_fold(path)) for path in paths]) | pairs


def held_out_check(model: FoldingModel, paths: list[Path], samples: list[tuple[torch.Tensor, torch.Tensor]],
                   training: PairTraining, every: int) -> dict[str, float]:
    """Fit on all but every `every`-th fold and score on those left out -> {"check_chains",
    "check_residues", "pearson_check" (the readout's Pearson r with their true lDDT-Cα),
    "pearson_check_without_pairs" (the same with the per-pair network's features held at 0, which the
    fit weighs 0: the readout as it was without them)}. Leaves the model fitted on the rest."""
    left = list(range(0, len(paths), every))
    fitted = [k for k in range(len(paths)) if k % every]
    if not fitted:
        raise ValueError(f"the check needs folds to fit on; got {len(paths)} folds with every {every}th left out")
    fit_pairs(model, [samples[k] for k in fitted], training)
    examples = [readout_example(model, read_fold(path)) for path in paths]
    targets = torch.cat([examples[k][1] for k in left])
    pair_columns = [FEATURES.index(name) for name in RESIDUE_FEATURES]
    check = {"check_chains": len(left), "check_residues": len(targets)}
    for name, without_pairs in (("pearson_check_without_pairs", True), ("pearson_check", False)):
        def features(indices: list[int]) -> torch.Tensor:
            stacked = torch.cat([examples[k][0] for k in indices])
            if without_pairs:
                stacked[:, pair_columns] = 0.0
            return stacked

        model.confidence_readout.fit(features(fitted), torch.cat([examples[k][1] for k in fitted]))
        check[name] = round(pearson(model.confidence_readout(features(left)), targets), 4)
    return check


def card_line(stats: dict[str, float], command: str) -> str:
    """The model card's line about the fit (fit_readout's stats, with fit_burial's when the burial
    network was trained; else the line says the model's own burial network was kept)."""
    epochs = stats.get("burial_epochs", 0)
    burial = (f"; burial network (`protein.burial`) trained on {stats['burial_chains']:,} training chains for {epochs} "
              f"epoch{'s' if epochs != 1 else ''}, its predicted neighbour count at Pearson r "
              f"{stats['burial_pearson']:.3f} with the true one on those validation chains" if "burial_chains" in stats
              else "; the burial network (`protein.burial`) is the model's own, kept from an earlier fit")
    pairs = (f"; the per-pair network (`protein.pair_confidence`) it reads trained first on {stats['pair_examples']:,} "
             f"pairs drawn from those folds for {stats['pair_epochs']} epochs (binary cross-entropy "
             f"{stats['pair_loss']:.4f})" if "pair_examples" in stats else "")
    check = (f"; fitted first without {stats['check_chains']} of the chains, it scored those at Pearson r "
             f"{stats['pearson_check']:.3f} ({stats['pearson_check_without_pairs']:.3f} without the per-pair network's "
             f"features)" if "check_chains" in stats else "")
    return (f"{CARD_LINE} (`protein.confidence_readout`) on realised folds of {stats['chains']} validation chains "
            f"({stats['residues']:,} residues) that no reported figure reads: `{command}`; Pearson r with their "
            f"true lDDT-Cα {stats['pearson_before']:.3f} unfitted, {stats['pearson_fitted']:.3f} fitted{check}{pairs}"
            f"{burial}.")


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
    parser.add_argument("--folds", help="folder the realised folds are kept in and read back from (default: a "
                        "temporary one); a few MB a chain")
    parser.add_argument("--check-every", type=int, default=4,
                        help="first fit on all but every Nth chain and report the readout's r on those (0: no check)")
    parser.add_argument("--output", help="model folder to write (default: the model's own)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.burial_epochs < 0 or args.check_every < 0 or args.check_every == 1:
        raise SystemExit(f"--burial-epochs must be >= 0 and --check-every 0 or >= 2; got {args.burial_epochs} and "
                         f"{args.check_every}")
    # What this command fits is not read from the folder, so a model saved before it existed loads.
    model = load(args.model, refit=(*FITTED, "burial.") if args.burial_epochs else FITTED)
    if not isinstance(model, FoldingModel):
        raise SystemExit(f"model must be a folding model; {args.model!r} is a {type(model).__name__}")
    folder = locate(args.model)
    chains = fitting_chains(Path(args.chains_file), args.chains)
    started = time.perf_counter()
    burial = {}
    if args.burial_epochs:
        burial = fit_burial(model, load_chains("train", Path(args.chains_file)), args.burial_epochs, chains)
        print(f"burial network: {burial} after {time.perf_counter() - started:.0f} s", flush=True)
    with tempfile.TemporaryDirectory() as temporary:
        kept = Path(args.folds or temporary)
        kept.mkdir(parents=True, exist_ok=True)
        digest, paths, samples, training = fold_digest(model), [], [], PairTraining()
        for index, chain in enumerate(chains):
            paths.append(stored_fold(model, chain, digest, kept))
            samples.append(pair_sample(model, read_fold(paths[-1]), training, index))
            print(f"  {index + 1}/{len(chains)} {chain.name} L={len(chain.sequence)}", flush=True)
        check = held_out_check(model, paths, samples, training, args.check_every) if args.check_every else {}
        if check:
            print(f"check, fitted without every {args.check_every}th chain: {check} after "
                  f"{time.perf_counter() - started:.0f} s", flush=True)
        stats = fit_folds(model, paths, samples, training) | check | burial
    print(f"fitted on {stats['chains']} chains, {stats['residues']} residues in {time.perf_counter() - started:.0f} s: "
          f"Pearson r {stats['pearson_before']} unfitted, {stats['pearson_fitted']} fitted; per-pair network "
          f"{ {k: v for k, v in stats.items() if k.startswith('pair_')} }")
    command = (f"python -m protein.fit_confidence {args.model} --chains-file {Path(args.chains_file).name} "
               f"--burial-epochs {args.burial_epochs} --chains {args.chains} --check-every {args.check_every}")
    card = (folder / CARD_FILE).read_text() if (folder / CARD_FILE).exists() else f"# {folder.name}\n"
    output = Path(args.output) if args.output else folder
    zoo.save(model, output, card=with_card_line(card, card_line(stats, command)),
             extra={k: v for k, v in read_config(folder).items() if k not in ("arch", "config")},
             files={p.name: p.read_bytes() for p in folder.iterdir()
                    if p.is_file() and p.name not in (CARD_FILE, CONFIG_FILE, WEIGHTS_FILE)})
    print(f"saved {output}")


if __name__ == "__main__":
    main()
