"""Recipe `gpt_moe`: a sparse GPT (a mixture of experts in every block) against the dense GPT of the
same active parameters per token, on Shakespeare's characters, the same steps and data.

    zoo train gpt_moe [--train.max_steps 600] [--sparse.n_experts 8]

Both train from one seed on the same batches in the same order; each is evaluated on the held-out
end of the corpus. The dense twin has the sparse model's shape with a dense feed-forward of
8 W^2 parameters (fc1, fc2 of 4 W) where the sparse one sends each token to top_k gated experts of
3 W F each: with the defaults (W 192, F 256, top-2) both run 294,912 feed-forward parameters a
token. The experts' load is counted on every training micro batch (each expert's share of the
assignments, per layer). Writes the sparse model, its card holding both validation losses, the
load and the command, into the zoo as `gpt-moe-shakespeare`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

import zoo
from nlp.gpt import GPT, GPTConfig
from recipes.gpt_shakespeare import shakespeare_blocks
from trainers import Strategy, TrainConfig, Trainer
from zoo.nn.moe import MoEFeedForward
from zoo.recipes import Recipe, command_line
from zoo.store import user_zoo_dir

log = logging.getLogger(__name__)


@dataclass
class GPTMoEConfig:
    """Settings of the recipe; every field can be set with `zoo train gpt_moe --a.b value`."""

    sparse: GPTConfig = field(default_factory=lambda: GPTConfig(
        vocab_size=1, block_size=128, n_layer=4, n_head=6, n_embd=192, bias=False, n_experts=8, moe_top_k=2,
        moe_hidden=256))
    """The sparse model; vocab_size is replaced by the tokenizer's. The dense twin is this shape
    without experts (feed-forwards of 4 x n_embd)."""
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        global_batch_size=32, micro_batch_size=16, max_steps=600, lr=3e-3, warmup_steps=30, weight_decay=0.1,
        log_every=50, eval_every=200, eval_batches=16, output_dir="runs/gpt_moe"))
    """Optimisation settings, the same for both models."""
    strategy: Strategy = field(default_factory=lambda: Strategy(precision="auto"))
    """Memory strategy, the same for both models (the dense twin, without experts, at ep=1)."""
    validation_fraction: float = 0.05
    """Share of the corpus (its end) held out for validation."""
    output: str = ""
    """Model folder of the sparse model; empty: the zoo entry `gpt-moe-shakespeare` in the user's zoo."""

    def __post_init__(self) -> None:
        if not self.sparse.n_experts:
            raise ValueError("GPTMoEConfig.sparse.n_experts must be >= 1: the recipe compares a sparse GPT with its "
                             "dense twin")


def dense_twin(sparse: GPTConfig) -> GPTConfig:
    """`sparse` with dense feed-forwards."""
    return dataclasses.replace(sparse, n_experts=0)


def active_feed_forward_parameters(config: GPTConfig) -> int:
    """Feed-forward parameters a token runs through, per block, without biases: 8 W^2 dense,
    top_k x 3 W F routed (the router's E W beside them, 0.5% with the defaults, not counted)."""
    width = config.n_embd
    if not config.n_experts:
        return 8 * width * width
    return config.moe_top_k * 3 * width * (config.moe_hidden or 4 * width)


class ExpertLoad:
    """Each mixture-of-experts layer's assignments per expert on every forward while attached."""

    def __init__(self, model: nn.Module) -> None:
        self.layers = [module for module in model.modules() if isinstance(module, MoEFeedForward)]
        self.counts: list[list[torch.Tensor]] = [[] for _ in self.layers]
        for layer, module in enumerate(self.layers):
            module.register_forward_hook(lambda m, args, out, layer=layer: self.counts[layer].append(
                m.expert_counts.cpu()) if m.training else None)

    def summary(self) -> dict[str, Any]:
        """Per layer: each expert's share of all assignments, and the lowest and highest share an
        expert had on one micro batch."""
        layers = []
        for counts in self.counts:
            stacked = torch.stack(counts).double()
            shares = stacked / stacked.sum(1, keepdim=True)
            layers.append({"share": [round(x, 4) for x in (stacked.sum(0) / stacked.sum()).tolist()],
                           "min_share": round(shares.min().item(), 4), "max_share": round(shares.max().item(), 4),
                           "micro_batches": len(counts)})
        return {"layers": layers}


def train_one(model_config: GPTConfig, config: GPTMoEConfig, data) -> tuple[Trainer, list[dict], ExpertLoad | None]:
    torch.manual_seed(config.train.seed)
    model = GPT(model_config)
    load = ExpertLoad(model) if model_config.n_experts else None
    strategy = config.strategy if model_config.n_experts else dataclasses.replace(config.strategy, ep=1)  # no experts
    trainer = Trainer(model, dataclasses.replace(config.train, output_dir=str(Path(config.train.output_dir) /
                                                 ("sparse" if model_config.n_experts else "dense"))), strategy)
    return trainer, trainer.fit(data.train, data.validation), load


def run(config: GPTMoEConfig) -> dict[str, Any]:
    """Train the dense twin, then the sparse model; compare; save the sparse one. Call on every rank."""
    data = shakespeare_blocks("char", config.sparse.block_size, config.validation_fraction)
    sparse_config = dataclasses.replace(config.sparse, vocab_size=data.tokenizer.vocab_size)
    dense_config = dense_twin(sparse_config)
    results = {}
    for name, model_config in (("dense", dense_config), ("sparse", sparse_config)):
        trainer, history, load = train_one(model_config, config, data)
        evaluation = [r for r in history if "eval_loss" in r][-1]
        results[name] = {"validation_loss": evaluation["eval_loss"], "train_loss": history[-1]["loss"],
                         "parameters": trainer.num_parameters(),
                         "active_feed_forward_parameters": active_feed_forward_parameters(model_config),
                         "validation_curve": [(r["step"], round(r["eval_loss"], 4)) for r in history if "eval_loss" in r]}
        if load is not None:
            results[name]["expert_load"] = load.summary()
            state = trainer.full_state_dict()
        log.info("%s GPT: validation loss %.4f", name, evaluation["eval_loss"])
    if not trainer.env.is_main:
        return results
    model = GPT(sparse_config)
    model.load_state_dict(state)
    output = Path(config.output) if config.output else user_zoo_dir() / "gpt-moe-shakespeare"
    command = command_line(RECIPE, config, trainer.env.world_size)
    zoo.save(model, output, card=_card(output.name, sparse_config, config, results, command),
             extra={"tokenizer": data.tokenizer.spec(), "metrics": results})
    print(f"\nvalidation loss: sparse {results['sparse']['validation_loss']:.4f}, dense "
          f"{results['dense']['validation_loss']:.4f} ({config.train.max_steps} steps each)")
    print(f"\nsaved {output}")
    return results


def _card(name: str, model_config: GPTConfig, config: GPTMoEConfig, results: dict[str, Any], command: str) -> str:
    sparse, dense = results["sparse"], results["dense"]
    load = sparse["expert_load"]["layers"]
    rows = "\n".join(f"| {i} | {' '.join(f'{s:.3f}' for s in layer['share'])} | {layer['min_share']:.3f} | "
                     f"{layer['max_share']:.3f} |" for i, layer in enumerate(load))
    return f"""# {name}

A sparse character GPT on Shakespeare (42 Project Gutenberg texts, public domain): {model_config.n_experts} experts
in every block, top-{model_config.moe_top_k} routing, dropless; beside it its dense twin of the same active
feed-forward parameters per token ({sparse['active_feed_forward_parameters']:,} vs {dense['active_feed_forward_parameters']:,} a block),
trained from the same seed on the same batches for the same {config.train.max_steps} steps.

- Made by: `{command}`
- Model: {json.dumps(dataclasses.asdict(model_config))}
- Parameters: sparse {sparse['parameters']:,}, dense {dense['parameters']:,}

| model | validation loss (nats / character) | final training loss |
|---|---|---|
| sparse | {sparse['validation_loss']:.4f} | {sparse['train_loss']:.4f} |
| dense | {dense['validation_loss']:.4f} | {dense['train_loss']:.4f} |

Validation curves (step, loss): sparse {sparse['validation_curve']}; dense {dense['validation_curve']}.

## Experts' load (training micro batches; no token dropped)

| layer | share of assignments per expert | lowest share on a micro batch | highest |
|---|---|---|---|
{rows}

Load it with `zoo.load("{name}")`.
"""


RECIPE = Recipe(name="gpt_moe", config_class=GPTMoEConfig, run=run, produces=("gpt-moe-shakespeare",),
                description="sparse GPT (experts) against its dense twin on Shakespeare")

if __name__ == "__main__":
    run(GPTMoEConfig())
