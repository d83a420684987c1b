"""Recipe `bert_sentiment`: fine-tune bert-minilm-l6 to tell positive from negative snippets.

    zoo train bert_sentiment                         the default: 1 rank, fp32, ZeRO-1, Amazon held out
    zoo train bert_sentiment --nproc 2 --strategy.zero 3

Data: the 23,703 human-rated snippets of Hutto & Gilbert (ICWSM 2014); label 1 when the mean rating
is > 0. The test set is one whole source never trained on (default: the 3,708 Amazon review
snippets); 5% of the other sources, drawn with a fixed seed, validate. Reports validation and
test accuracy beside the majority-class baseline, writes the model (weights, config with tokenizer,
card) into the user's zoo as `bert-sentiment`.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

import zoo
from nlp.bert import Bert
from nlp.data import pad_collate
from nlp.tokenizers import tokenizer_from_spec
from recipes.report import trainer_memory_report
from trainers import Strategy, TrainConfig, Trainer
from trainers.loop.data import first_micro_batch
from zoo.corpora import VADER_SOURCES, vader_snippets
from zoo.recipes import Recipe, command_line
from zoo.store import read_config, user_zoo_dir

log = logging.getLogger(__name__)

Source = Literal["movie", "tweets", "amazon", "nyt"]


@dataclass
class BertSentimentConfig:
    """Settings of the recipe; every field can be set with `zoo train bert_sentiment --a.b value`."""

    base: str = "bert-minilm-l6"
    """Zoo entry (or folder) of the pretrained encoder to fine-tune."""
    test_source: Source = "amazon"
    """Snippet source held out whole as the test set."""
    validation_fraction: float = 0.05
    """Share of the training sources' snippets held out for validation."""
    max_length: int = 64
    """WordPiece tokens per snippet, [CLS] and [SEP] included (longer snippets are cut)."""
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        global_batch_size=32, micro_batch_size=16, max_steps=400, lr=5e-5, warmup_steps=40, weight_decay=0.01,
        betas=(0.9, 0.999), log_every=50, eval_every=200, eval_batches=8, output_dir="runs/bert_sentiment"))
    """Optimisation settings."""
    strategy: Strategy = field(default_factory=lambda: Strategy(zero=1))
    """Memory strategy."""
    output: str = ""
    """Model folder to write; empty: the zoo entry `bert-sentiment` in the user's zoo."""
    accuracy_examples: int = 0
    """Measure accuracy on the first this many examples of each split (0: all; for quick runs)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.validation_fraction < 0.5:
            raise ValueError(f"validation_fraction must be in (0, 0.5); got {self.validation_fraction}")
        if self.accuracy_examples < 0:
            raise ValueError(f"accuracy_examples must be >= 0; got {self.accuracy_examples}")
        if self.max_length < 2:
            raise ValueError(f"max_length must be >= 2; got {self.max_length}")


def split_snippets(snippets: list[dict[str, Any]], test_source: str, validation_fraction: float,
                   seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """{"train", "validation", "test"}: the test set is every snippet of `test_source`; the rest is
    shuffled with `seed` and its first `validation_fraction` validates."""
    rest = [s for s in snippets if s["source"] != test_source]
    order = torch.randperm(len(rest), generator=torch.Generator().manual_seed(seed)).tolist()
    cut = int(len(rest) * validation_fraction)
    return {"train": [rest[i] for i in order[cut:]], "validation": [rest[i] for i in order[:cut]],
            "test": [s for s in snippets if s["source"] == test_source]}


def classifier_from(base: Bert) -> Bert:
    """A two-class `Bert` with the encoder and pooler of `base` and a freshly initialised classifier."""
    model = Bert(dataclasses.replace(base.config, head="classification", num_labels=2))
    missing, unexpected = model.load_state_dict(base.state_dict(), strict=False)
    if sorted(missing) != ["classifier.bias", "classifier.weight"] or unexpected:
        raise ValueError(f"base model does not fit a classifier: missing {missing}, unexpected {unexpected}")
    return model


@torch.no_grad()
def accuracy(model: Bert, examples: list[dict[str, torch.Tensor]], collate, batch_size: int = 64) -> float:
    """Share of `examples` whose argmax class equals the label (batched by length)."""
    model.eval()
    order = sorted(range(len(examples)), key=lambda i: examples[i]["input_ids"].numel())
    correct = 0
    for start in range(0, len(order), batch_size):
        batch = collate([examples[i] for i in order[start : start + batch_size]])
        labels = batch.pop("labels")
        correct += (model(**batch)["logits"].argmax(-1) == labels).sum().item()
    return correct / len(examples)


def run(config: BertSentimentConfig) -> dict[str, Any]:
    """Fine-tune, evaluate, report memory, save the model. Call on every rank."""
    tokenizer = tokenizer_from_spec(read_config(config.base)["tokenizer"])
    splits = split_snippets(vader_snippets(), config.test_source, config.validation_fraction, config.train.seed)

    def encode(snippets: list[dict[str, Any]]) -> list[dict[str, torch.Tensor]]:
        return [{"input_ids": torch.tensor(tokenizer.encode(s["text"], config.max_length)),
                 "labels": torch.tensor(int(s["rating"] > 0))} for s in snippets]

    data = {name: encode(snippets) for name, snippets in splits.items()}
    log.info("VADER snippets: %s (test: %s, never trained on)", ", ".join(f"{len(v)} {k}" for k, v in data.items()),
             config.test_source)
    collate = pad_collate(tokenizer.pad_id)
    torch.manual_seed(config.train.seed)
    model = classifier_from(zoo.load(config.base))
    trainer = Trainer(model, config.train, config.strategy,
                      example_batch=first_micro_batch(data["train"], config.train.micro_batch_size, collate))
    history = trainer.fit(data["train"], data["validation"], collate_fn=collate)
    state = trainer.full_state_dict()
    if not trainer.env.is_main:
        return {}

    memory = trainer_memory_report(trainer)
    model = Bert(model.config)
    model.load_state_dict(state)
    limit = config.accuracy_examples or None
    measured = {name: data[name][:limit] for name in ("validation", "test")}
    positives = sum(int(e["labels"]) for e in measured["test"])
    metrics = {
        "validation_accuracy": accuracy(model, measured["validation"], collate),
        "test_accuracy": accuracy(model, measured["test"], collate),
        "test_majority_baseline": max(positives, len(measured["test"]) - positives) / len(measured["test"]),
        "validation_loss": [r for r in history if "eval_loss" in r][-1]["eval_loss"],
        "steps": trainer.step,
        "examples_seen": trainer.step * config.train.global_batch_size,
        "sizes": {name: len(examples) for name, examples in data.items()},
        "accuracy_examples": {name: len(examples) for name, examples in measured.items()},
    }
    output = Path(config.output) if config.output else user_zoo_dir() / "bert-sentiment"
    command = command_line(RECIPE, config, trainer.env.world_size)
    card = _card(output.name, model, config, metrics, memory, trainer.env.world_size, command)
    zoo.save(model, output, card=card, extra={"tokenizer": tokenizer.spec(), "metrics": metrics})
    print(f"\nvalidation accuracy {metrics['validation_accuracy']:.4f}; test ({config.test_source}, never trained on) "
          f"accuracy {metrics['test_accuracy']:.4f} vs majority class {metrics['test_majority_baseline']:.4f}")
    print("\nmemory per rank, measured in training step 2 vs the ZeRO-paper estimate:\n" + memory)
    print(f"\nsaved {output}")
    return metrics


def _card(name: str, model: Bert, config: BertSentimentConfig, metrics: dict[str, Any], memory: str,
          world_size: int, command: str) -> str:
    sources = ", ".join(s for s in VADER_SOURCES if s != config.test_source)
    return f"""# {name}

`{config.base}` ({model.num_parameters() / 1e6:.1f} M parameters) fine-tuned as a binary sentiment classifier
(label 1: mean human rating > 0) on the human-rated snippets of Hutto & Gilbert (ICWSM 2014, shipped
in the vaderSentiment source archive, MIT).

- Made by: `{command}` ({world_size} rank(s), strategy {dataclasses.asdict(config.strategy)})
- Training: {metrics['steps']} steps of {config.train.global_batch_size} snippets ({metrics['examples_seen']:,} snippets seen) from
  {sources}; {metrics['sizes']['train']:,} training, {metrics['sizes']['validation']:,} validation snippets; at most {config.max_length} tokens
- Validation accuracy ({metrics['accuracy_examples']['validation']:,} snippets held out from those sources): {metrics['validation_accuracy']:.4f}
- Test accuracy on {metrics['accuracy_examples']['test']:,} of the {metrics['sizes']['test']:,} `{config.test_source}` snippets (a source never trained on):
  {metrics['test_accuracy']:.4f}; majority-class baseline {metrics['test_majority_baseline']:.4f}

## Memory per rank (measured in training step 2)

{memory}

Load it with `zoo.load("{name}")`: `model(**tokenizer.batch(texts, 64))["logits"]` (class 1 = positive).
"""


RECIPE = Recipe(name="bert_sentiment", config_class=BertSentimentConfig, run=run, produces=("bert-sentiment",),
                description="fine-tune bert-minilm-l6 on human-rated sentiment snippets (Amazon held out)")

if __name__ == "__main__":
    run(BertSentimentConfig())
