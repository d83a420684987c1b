"""Recipe `gpt_shakespeare`: a small GPT on the complete works of Shakespeare.

    zoo train gpt_shakespeare --nproc 2                       the default: characters, ZeRO-3, bf16 where native
    zoo train gpt_shakespeare --tokenizer gpt2 --train.max_steps 2000

Held-out text: the last `validation_fraction` of the corpus. Reports validation perplexity (per
token of the chosen tokenizer), the per-rank memory report beside the ZeRO-paper estimate, and a
generated sample; writes the model folder (weights, config with tokenizer, card) into the zoo.
"""

from __future__ import annotations

import dataclasses
import logging
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

import zoo
from nlp.data import TokenBlocks
from nlp.gpt import GPT, GPTConfig
from nlp.tokenizers import CharTokenizer, GPT2Tokenizer, TextTokenizer
from recipes.report import trainer_memory_report
from trainers import Strategy, TrainConfig, Trainer
from trainers.loop.data import first_micro_batch
from zoo.corpora import shakespeare_text
from zoo.recipes import Recipe, command_line
from zoo.store import user_zoo_dir

log = logging.getLogger(__name__)


@dataclass
class GPTShakespeareConfig:
    """Settings of the recipe; every field can be set with `zoo train gpt_shakespeare --a.b value`."""

    tokenizer: Literal["char", "gpt2"] = "char"
    """"char": one token per character (vocabulary from the corpus); "gpt2": GPT-2's BPE."""
    model: GPTConfig = field(default_factory=lambda: GPTConfig(vocab_size=1, block_size=128, n_layer=4, n_head=4, n_embd=128))
    """Model shape; vocab_size is replaced by the tokenizer's."""
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        global_batch_size=32, micro_batch_size=16, max_steps=300, lr=3e-3, warmup_steps=30, weight_decay=0.1,
        log_every=25, eval_every=100, eval_batches=8, output_dir="runs/gpt_shakespeare"))
    """Optimisation settings."""
    strategy: Strategy = field(default_factory=lambda: Strategy(zero=3, precision="auto"))
    """Memory strategy."""
    validation_fraction: float = 0.05
    """Share of the corpus (its end) held out for validation."""
    output: str = ""
    """Model folder to write; empty: the zoo entry `gpt-shakespeare-<tokenizer>` in the user's zoo."""
    sample_prompt: str = "ROMEO.\n"
    """Prompt of the generated sample."""
    sample_tokens: int = 300
    """Tokens to generate for the sample."""

    def __post_init__(self) -> None:
        if not 0.0 < self.validation_fraction < 0.5:
            raise ValueError(f"validation_fraction must be in (0, 0.5); got {self.validation_fraction}")


def build_tokenizer(kind: str, text: str) -> TextTokenizer:
    """The recipe's tokenizer of the given kind."""
    return CharTokenizer.from_text(text) if kind == "char" else GPT2Tokenizer()


@dataclass
class ShakespeareBlocks:
    """The corpus tokenized and cut into training blocks and held-out validation blocks (its end)."""

    tokenizer: TextTokenizer
    ids: torch.Tensor
    """Every token id of the corpus."""
    split: int
    """Index of the first validation token."""
    train: TokenBlocks
    validation: TokenBlocks

    @property
    def characters_per_validation_token(self) -> float:
        return len(self.tokenizer.decode(self.ids[self.split:].tolist())) / (self.ids.numel() - self.split)


def shakespeare_blocks(tokenizer_kind: str, block: int, validation_fraction: float) -> ShakespeareBlocks:
    """Shakespeare in blocks of `block` tokens of the `tokenizer_kind` tokenizer, the last
    `validation_fraction` held out."""
    text = shakespeare_text()
    tokenizer = build_tokenizer(tokenizer_kind, text)
    ids = torch.tensor(tokenizer.encode(text), dtype=torch.long)
    split = int(ids.numel() * (1.0 - validation_fraction))
    data = ShakespeareBlocks(tokenizer, ids, split, TokenBlocks(ids[:split], block), TokenBlocks(ids[split:], block))
    log.info("Shakespeare: %s characters, %s %s tokens; %d training and %d validation blocks of %d tokens",
             f"{len(text):,}", f"{ids.numel():,}", tokenizer_kind, len(data.train), len(data.validation), block)
    return data


def run(config: GPTShakespeareConfig) -> dict[str, Any]:
    """Train, evaluate, report memory, save the model, print a sample. Call on every rank."""
    data = shakespeare_blocks(config.tokenizer, config.model.block_size, config.validation_fraction)
    tokenizer, block = data.tokenizer, config.model.block_size
    train_set, validation_set = data.train, data.validation

    model_config = dataclasses.replace(config.model, vocab_size=tokenizer.vocab_size)
    torch.manual_seed(config.train.seed)
    trainer = Trainer(GPT(model_config), config.train, config.strategy,
                      example_batch=first_micro_batch(train_set, config.train.micro_batch_size))
    history = trainer.fit(train_set, validation_set)
    state = trainer.full_state_dict()
    if not trainer.env.is_main:
        return {}

    evaluation = [r for r in history if "eval_loss" in r][-1]
    characters_per_token = data.characters_per_validation_token
    metrics = {
        "validation_loss": evaluation["eval_loss"],
        "validation_perplexity": math.exp(evaluation["eval_loss"]),
        # comparable across tokenizers: nats per token over characters per token, in bits
        "validation_bits_per_character": evaluation["eval_loss"] / characters_per_token / math.log(2),
        "train_loss": history[-1]["loss"],
        "steps": trainer.step,
        "tokens_seen": trainer.step * config.train.global_batch_size * block,
    }
    memory = trainer_memory_report(trainer)
    model = GPT(model_config)
    model.load_state_dict(state)
    model.eval()
    prompt = torch.tensor([tokenizer.encode(config.sample_prompt)], dtype=torch.long)
    sample = tokenizer.decode(model.generate(prompt, config.sample_tokens, temperature=0.8,
                                             generator=torch.Generator().manual_seed(0))[0].tolist())
    output = Path(config.output) if config.output else user_zoo_dir() / f"gpt-shakespeare-{config.tokenizer}"
    command = command_line(RECIPE, config, trainer.env.world_size)
    card = _card(output.name, model, model_config, config, metrics, memory, trainer.env.world_size, command)
    zoo.save(model, output, card=card, extra={"tokenizer": tokenizer.spec(), "metrics": metrics})
    print(f"\nvalidation perplexity {metrics['validation_perplexity']:.3f} (loss {metrics['validation_loss']:.4f}, "
          f"{metrics['validation_bits_per_character']:.3f} bits per character)")
    print("\nmemory per rank, measured in training step 2 vs the ZeRO-paper estimate:\n" + memory)
    print(f"\nsample ({config.sample_tokens} tokens after {config.sample_prompt!r}):\n{sample}")
    print(f"\nsaved {output}")
    return metrics


def _card(name: str, model: GPT, model_config: GPTConfig, config: GPTShakespeareConfig, metrics: dict[str, Any],
          memory: str, world_size: int, command: str) -> str:
    return f"""# {name}

A {model.num_parameters() / 1e6:.2f} M-parameter GPT (pre-LN decoder, learned positions, tied embeddings)
trained on the complete works of Shakespeare (42 Project Gutenberg texts, public domain), with the
`{config.tokenizer}` tokenizer.

- Made by: `{command}` ({world_size} rank(s), strategy {dataclasses.asdict(config.strategy)})
- Model: {json.dumps(dataclasses.asdict(model_config))}
- Training: {metrics['steps']} steps of {config.train.global_batch_size} x {model_config.block_size} tokens ({metrics['tokens_seen']:,} tokens)
- Validation (last {config.validation_fraction:.0%} of the corpus): loss {metrics['validation_loss']:.4f}, perplexity {metrics['validation_perplexity']:.3f} per token, {metrics['validation_bits_per_character']:.3f} bits per character

## Memory per rank (measured in training step 2)

{memory}

Load it with `zoo.load("{name}")`; sample with `zoo generate {name} "ROMEO."`.
"""


RECIPE = Recipe(name="gpt_shakespeare", config_class=GPTShakespeareConfig, run=run,
                produces=("gpt-shakespeare-char", "gpt-shakespeare-gpt2"), description="character GPT on Shakespeare (ZeRO-3, bf16 where native)")

if __name__ == "__main__":
    run(GPTShakespeareConfig())
