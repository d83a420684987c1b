"""Recipe `fold_tiny`: a small AlphaFold-style model trained on the shipped ProMod3 chains.

    zoo train fold_tiny                                        the default (1 rank, CPU)
    zoo train fold_tiny --nproc 2 --strategy.zero 2 --strategy.recompute blocks

Trains on random crops of the training chains (MSA rows sampled from each chain's HHblits profile,
the profile withheld from a quarter of the crops), then folds every validation and test chain
whole (the first 24 of each by default), with and without its profile, and reports lDDT-Cα, TM-score and GDT-TS against the
baseline of an ideal extended chain (Cα 3.8 Å apart on a line). Writes the model into the user's
zoo as `fold-tiny`.
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
from protein.baselines import extended_chain
from protein.data import CropConfig, FoldingExamples, ProteinChain, collate_folding, load_chains
from protein.evoformer import EvoformerConfig
from protein.folding import fold
from protein.metrics import gdt_ts, lddt, tm_score
from protein.model import FoldConfig, FoldingModel
from protein.structure_module import StructureConfig
from recipes.report import trainer_memory_report
from trainers import Strategy, TrainConfig, Trainer
from trainers.data import first_micro_batch
from zoo.recipes import Recipe, command_line
from zoo.store import user_zoo_dir

log = logging.getLogger(__name__)

EVALUATED = ("validation", "test")


@dataclass
class FoldTinyConfig:
    """Settings of the recipe; every field can be set with `zoo train fold_tiny --a.b value`."""

    model: FoldConfig = field(default_factory=lambda: FoldConfig(
        evoformer=EvoformerConfig(msa_dim=32, pair_dim=32, blocks=4), structure=StructureConfig(single_dim=64, layers=4),
        max_recycles=1))
    """Model shape."""
    crop: CropConfig = field(default_factory=CropConfig)
    """Crop size, MSA rows, how often the profile is withheld."""
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        global_batch_size=4, micro_batch_size=4, max_steps=500, lr=1e-3, warmup_steps=50, weight_decay=0.0,
        min_lr_ratio=0.1, log_every=25, eval_every=250, eval_batches=4, output_dir="runs/fold_tiny"))
    """Optimisation settings."""
    strategy: Strategy = field(default_factory=Strategy)
    """Memory strategy."""
    output: str = ""
    """Model folder to write; empty: the zoo entry `fold-tiny` in the user's zoo."""
    evaluation_chains: int = 24
    """Fold the first this many chains of each evaluated split (0: all; a 250-residue chain takes
    about 10 s to fold on 2 CPU cores)."""

    def __post_init__(self) -> None:
        if self.evaluation_chains < 0:
            raise ValueError(f"evaluation_chains must be >= 0; got {self.evaluation_chains}")


def structure_scores(model: FoldingModel, chains: list[ProteinChain]) -> dict[str, float]:
    """Mean lDDT-Cα, TM-score and GDT-TS of the model's folds of `chains` (with and without the
    profile) and of the extended-chain baseline."""
    totals: dict[str, float] = {}
    for chain in chains:
        truth = chain.coordinates[:, 1]
        predictions = {"with_profile": fold(model, chain.sequence, chain.profile).backbone[:, 1],
                       "sequence_only": fold(model, chain.sequence).backbone[:, 1],
                       "extended_chain": extended_chain(len(chain.sequence))}
        for name, ca in predictions.items():
            for metric, score in (("lddt", lddt), ("tm", tm_score), ("gdt_ts", gdt_ts)):
                key = f"{name}_{metric}"
                totals[key] = totals.get(key, 0.0) + score(ca, truth).item() / len(chains)
    return {key: round(value, 4) for key, value in totals.items()} | {"chains": len(chains)}


def run(config: FoldTinyConfig) -> dict[str, Any]:
    """Train, evaluate, report memory, save the model. Call on every rank."""
    train_chains, validation_chains = load_chains("train"), load_chains("validation")
    log.info("ProMod3 chains: %d training, %d validation", len(train_chains), len(validation_chains))
    torch.manual_seed(config.train.seed)
    model = FoldingModel(config.model)
    examples = FoldingExamples(train_chains, config.crop)
    trainer = Trainer(model, config.train, config.strategy,
                      example_batch=first_micro_batch(examples, config.train.micro_batch_size, collate_folding))
    started = time.perf_counter()
    history = trainer.fit(examples,
                          FoldingExamples(validation_chains, config.crop, random=False), collate_fn=collate_folding)
    train_seconds = time.perf_counter() - started
    state = trainer.full_state_dict()
    if not trainer.env.is_main:
        return {}

    memory = trainer_memory_report(trainer)
    model = FoldingModel(model.config)
    model.load_state_dict(state)
    model.eval()
    limit = config.evaluation_chains or None
    metrics: dict[str, Any] = {split: structure_scores(model, load_chains(split)[:limit]) for split in EVALUATED}
    metrics.update({"validation_loss": [r for r in history if "eval_loss" in r][-1]["eval_loss"], "steps": trainer.step,
                    "train_seconds": round(train_seconds, 1), "train_chains": len(train_chains)})
    output = Path(config.output) if config.output else user_zoo_dir() / "fold-tiny"
    command = command_line(RECIPE, config, trainer.env.world_size)
    zoo.save(model, output, card=_card(output.name, model, config, metrics, memory, trainer.env.world_size, command),
             extra={"metrics": metrics})
    print("\nmean scores of whole chains (lDDT-Cα / TM-score / GDT-TS):")
    for split in EVALUATED:
        scores = metrics[split]
        for name in ("with_profile", "sequence_only", "extended_chain"):
            print(f"  {split:10s} {name:15s} {scores[f'{name}_lddt']:.4f} / {scores[f'{name}_tm']:.4f} / "
                  f"{scores[f'{name}_gdt_ts']:.4f} ({scores['chains']} chains)")
    print("\nmemory per rank, measured in training step 2 vs the ZeRO-paper estimate:\n" + memory)
    print(f"\nsaved {output}")
    return metrics


def _card(name: str, model: FoldingModel, config: FoldTinyConfig, metrics: dict[str, Any], memory: str,
          world_size: int, command: str) -> str:
    rows = "\n".join(f"| {split} | {kind} | {metrics[split][f'{kind}_lddt']:.4f} | {metrics[split][f'{kind}_tm']:.4f} | "
                     f"{metrics[split][f'{kind}_gdt_ts']:.4f} |"
                     for split in EVALUATED for kind in ("with_profile", "sequence_only", "extended_chain"))
    parameters = sum(p.numel() for p in model.parameters()) / 1e6
    e, s = model.config.evoformer, model.config.structure
    return f"""# {name}

An AlphaFold-style folding model: {e.blocks} Evoformer blocks (MSA width {e.msa_dim}, pair width {e.pair_dim}),
a {s.layers}-layer structure module with invariant point attention, backbone frames without torsions,
distogram and pLDDT heads, up to {model.config.max_recycles} recycles; {parameters:.2f} M parameters. Trained on
{metrics['train_chains']:,} non-redundant PDB chains of the ProMod3 structure database (CC0), crops of
{config.crop.crop_size} residues, MSA rows sampled from HHblits profiles (profile withheld from
{config.crop.withhold_profile:.0%} of the crops).

- Made by: `{command}` ({world_size} rank(s), strategy {dataclasses.asdict(config.strategy)};
  {metrics['train_seconds']} s of training, {metrics['steps']} steps)
- Evaluated on whole chains of the validation and test splits (no sequence shared with training),
  folded with and without their profile; the baseline is an ideal extended chain.

| split | input | lDDT-Cα | TM-score | GDT-TS |
|---|---|---|---|---|
{rows}

## Memory per rank (measured in training step 2)

{memory}

Use it with `zoo fold {name} SEQUENCE -o out.pdb` or `protein.fold("{name}", sequence)` in Python.
"""


RECIPE = Recipe(name="fold_tiny", config_class=FoldTinyConfig, run=run, produces=("fold-tiny",),
                description="AlphaFold-style folding on ProMod3 chains (lDDT-Cα vs an extended chain)")

if __name__ == "__main__":
    run(FoldTinyConfig())
