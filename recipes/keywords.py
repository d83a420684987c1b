"""Recipe `keywords`: a microcontroller-size keyword spotter (MLPerf Tiny's DS-CNN) trained on spoken
digits, tested on FSDD speakers it never heard, then run under its partial-execution schedule.

    zoo train keywords                              the default: theo held out, about 5 minutes on 2 cores
    zoo train keywords --held_out george,jackson    other held-out speakers

Data: the Free Spoken Digit Dataset's recordings as shipped MFCCs (`asr.spoken_digits`, CC BY-SA
4.0): the held-out speakers' 500 clips each are the test set, never trained on; the other speakers'
clips, less a validation share, train with synthetic speakers (espeak-ng and flite voices saying the
digits, `asr.spoken_digits.synthetic_digits`). Features are normalised per clip
(`asr.keywords.keyword_features`) and augmented in training (`asr.keywords.KeywordAugmentation`).
After training, the model's network is scheduled by `zoo.partial.schedule` and run from one arena of
the schedule's size (`zoo.partial.ScheduleExecutor`) on every test clip, and streamed a row at a time
(`zoo.partial.stream`, the test clips side by side, each in its share of one arena): the predictions
of both must be the model's. Reports the held-out accuracy per speaker and per digit, the arenas, and
writes the model into the user's zoo as `kws-digits` (`zoo spot kws-digits WAV...`).
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import zoo
from asr.keyword_spotter import KeywordSpotter, KeywordSpotterConfig
from asr.keywords import KeywordAugmentation, normalise_per_clip
from asr.spoken_digits import DIGIT_WORDS, FSDD_SPEAKERS, SpokenDigits, fsdd_mfccs, synthetic_digits, synthetic_voices
from recipes.report import trainer_memory_report
from trainers import Strategy, TrainConfig, Trainer
from zoo.partial import ScheduleExecutor, schedule, stream
from zoo.recipes import Recipe, command_line
from zoo.store import user_zoo_dir

log = logging.getLogger(__name__)


@dataclass
class KeywordsConfig:
    """Settings of the recipe; every field can be set with `zoo train keywords --a.b value`."""

    held_out: tuple[str, ...] = ("theo",)
    """FSDD speakers never trained on: the test set."""
    validation_fraction: float = 0.05
    """Share of the training speakers' clips held out for validation."""
    espeak_voices: int = 200
    """Random espeak-ng voices (accent, variant, speed, pitch) saying the ten digits for training."""
    flite_speeds: tuple[int, ...] = tuple(range(120, 230, 10))
    """Speeds (words a minute) at which each flite voice says the digits for training."""
    model: KeywordSpotterConfig = field(default_factory=KeywordSpotterConfig)
    """The spotter's shape."""
    augmentation: KeywordAugmentation = field(default_factory=KeywordAugmentation)
    """Changes to the training features."""
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        global_batch_size=64, micro_batch_size=64, max_steps=3200, lr=3e-3, warmup_steps=300, min_lr_ratio=0.01,
        weight_decay=0.01, betas=(0.9, 0.999), log_every=200, eval_every=800, eval_batches=4,
        output_dir="runs/keywords"))
    """Optimisation settings."""
    strategy: Strategy = field(default_factory=Strategy)
    """Memory strategy."""
    output: str = ""
    """Model folder to write; empty: the zoo entry `kws-digits` in the user's zoo."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.held_out) - set(FSDD_SPEAKERS))
        if unknown or not self.held_out or len(set(self.held_out)) == len(FSDD_SPEAKERS):
            raise ValueError(f"held_out must name 1 to {len(FSDD_SPEAKERS) - 1} of FSDD's speakers {FSDD_SPEAKERS}; "
                             f"got {self.held_out}")
        if not 0 < self.validation_fraction < 0.5:
            raise ValueError(f"validation_fraction must be in (0, 0.5); got {self.validation_fraction}")
        if self.espeak_voices < 0 or any(speed < 1 for speed in self.flite_speeds):
            raise ValueError(f"espeak_voices must be >= 0 and flite_speeds positive; got {self.espeak_voices}, "
                             f"{self.flite_speeds}")


class KeywordClips(torch.utils.data.Dataset):
    """Spoken digits as examples {"input_features" (1, 49, 10) normalised per clip, "labels"}."""

    def __init__(self, digits: SpokenDigits) -> None:
        self.features, self.digits = normalise_per_clip(digits.features), digits.digits

    def __len__(self) -> int:
        return len(self.digits)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_features": self.features[index], "labels": self.digits[index]}


@dataclass
class KeywordCollate:
    """Stacks examples into a batch, augmenting the features when `augmentation` is set."""

    augmentation: KeywordAugmentation | None = None

    def __call__(self, examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        features = torch.stack([example["input_features"] for example in examples])
        if self.augmentation is not None:
            features = self.augmentation(features)
        return {"input_features": features, "labels": torch.stack([example["labels"] for example in examples])}


def digit_sets(config: KeywordsConfig) -> dict[str, SpokenDigits]:
    """{"train", "validation", "test"}: test the held-out speakers' FSDD clips; validation a seeded
    share of the others'; train the rest with the synthetic speakers."""
    fsdd = fsdd_mfccs()
    held = torch.tensor([speaker in config.held_out for speaker in fsdd.speakers])
    generator = torch.Generator().manual_seed(config.train.seed)
    validation = (torch.rand(len(fsdd), generator=generator) < config.validation_fraction) & ~held
    rng = random.Random(config.train.seed)
    started = time.perf_counter()
    synthetic = synthetic_digits(synthetic_voices(config.espeak_voices, config.flite_speeds, rng), rng)
    log.info("%d synthetic clips spoken in %.0f s", len(synthetic), time.perf_counter() - started)
    return {"train": SpokenDigits.join(fsdd.select(~held & ~validation), synthetic),
            "validation": fsdd.select(validation), "test": fsdd.select(held)}


@torch.no_grad()
def predictions(model: KeywordSpotter, clips: KeywordClips) -> torch.Tensor:
    """(N,) predicted class ids of the model in eval mode."""
    return model.eval()(clips.features)["logits"].argmax(-1)


def accuracy_table(test: SpokenDigits, predicted: torch.Tensor) -> dict[str, dict[str, float]]:
    """Accuracy by held-out speaker and by digit."""
    right = predicted == test.digits
    speakers = torch.tensor([FSDD_SPEAKERS.index(s) for s in test.speakers])
    return {"speaker": {name: right[speakers == i].float().mean().item() for i, name in enumerate(FSDD_SPEAKERS)
                        if (speakers == i).any()},
            "digit": {word: right[test.digits == d].float().mean().item() for d, word in enumerate(DIGIT_WORDS)}}


def evaluation_rows(test: SpokenDigits, probabilities: torch.Tensor) -> str:
    """Tab-separated, one row a test clip: its name, digit, the predicted digit and its probability
    (probabilities (N, classes): the model's on the test clips)."""
    best, predicted = probabilities.max(-1)
    rows = [f"{name}\t{DIGIT_WORDS[digit]}\t{DIGIT_WORDS[guess]}\t{p:.4f}"
            for name, digit, guess, p in zip(test.names, test.digits.tolist(), predicted.tolist(), best.tolist())]
    return "clip\tdigit\tpredicted\tprobability\n" + "\n".join(rows) + "\n"


@torch.no_grad()
def partial_execution(model: KeywordSpotter, clips: KeywordClips) -> dict[str, Any]:
    """The network's partial-execution schedule and its run from one arena over every clip, and its
    row stream over all clips at once: arena bytes a clip (sequential planner, schedule, executor, row
    stream), multiply-accumulates, and whether every prediction of each equals the model's."""
    network = model.eval().network
    plan = schedule(network, clips.features[:1])
    executor = ScheduleExecutor(plan, clips.features[:1])
    ran = torch.cat([executor.run(clip[None]).clone() for clip in clips.features])
    rows = stream(network, clips.features)
    streamed = rows.run(clips.features)
    expected = network(clips.features)
    return {"baseline_bytes": plan.baseline_bytes, "peak_bytes": plan.peak_bytes, "arena_bytes": executor.arena.numel(),
            "macs": plan.macs, "same_predictions": bool((ran.argmax(-1) == expected.argmax(-1)).all()),
            "largest_logit_difference": (ran - expected).abs().max().item(),
            "row_stream_bytes": rows.peak_bytes // len(clips.features),
            "row_stream_same_predictions": bool((streamed.argmax(-1) == expected.argmax(-1)).all()),
            "row_stream_products": rows.counted_products // len(clips.features)}


def run(config: KeywordsConfig) -> dict[str, Any]:
    """Train, test on the held-out speakers, run the Pex schedule, save the model. Call on every rank."""
    sets = digit_sets(config)
    log.info("spoken digits: %s", ", ".join(f"{len(digits)} {name}" for name, digits in sets.items()))
    clips = {name: KeywordClips(digits) for name, digits in sets.items()}
    torch.manual_seed(config.train.seed)
    model = KeywordSpotter(config.model)
    trainer = Trainer(model, config.train, config.strategy,
                      example_batch=KeywordCollate()([clips["train"][i] for i in range(config.train.micro_batch_size)]))
    started = time.perf_counter()
    history = trainer.fit(clips["train"], clips["validation"], collate_fn=KeywordCollate(config.augmentation),
                          eval_collate_fn=KeywordCollate())
    train_seconds = time.perf_counter() - started
    state = trainer.full_state_dict()
    if not trainer.env.is_main:
        return {}

    memory = trainer_memory_report(trainer)
    model = KeywordSpotter(config.model)
    model.load_state_dict(state)
    with torch.no_grad():
        probabilities = model.eval()(clips["test"].features)["logits"].softmax(-1)
    predicted = probabilities.argmax(-1)
    table = accuracy_table(sets["test"], predicted)
    metrics = {
        "test_accuracy": (predicted == sets["test"].digits).float().mean().item(), "test_accuracy_by": table,
        "validation_accuracy": (predictions(model, clips["validation"]) == sets["validation"].digits).float().mean().item(),
        "validation_loss": [r for r in history if "eval_loss" in r][-1]["eval_loss"],
        "partial_execution": partial_execution(model, clips["test"]),
        "held_out": list(config.held_out), "steps": trainer.step, "train_seconds": round(train_seconds, 1),
        "sizes": {name: len(digits) for name, digits in sets.items()},
    }
    output = Path(config.output) if config.output else user_zoo_dir() / "kws-digits"
    command = command_line(RECIPE, config, trainer.env.world_size)
    zoo.save(model, output, card=_card(output.name, model, config, metrics, memory, command),
             extra={"labels": list(DIGIT_WORDS), "features": "keyword_features", "metrics": metrics},
             files={"evaluation.tsv": evaluation_rows(sets["test"], probabilities).encode()})
    print(f"\nheld-out speakers {', '.join(config.held_out)}: accuracy {metrics['test_accuracy']:.4f} "
          f"({_figures(table['speaker'])}); by digit {_figures(table['digit'])}")
    pex = metrics["partial_execution"]
    print(f"arena: sequential {pex['baseline_bytes']:,} B, partial execution {pex['peak_bytes']:,} B, executor "
          f"{pex['arena_bytes']:,} B; same predictions on every test clip: {pex['same_predictions']}; row stream "
          f"{pex['row_stream_bytes']:,} B a clip, same predictions: {pex['row_stream_same_predictions']}")
    print(f"\nsaved {output}")
    return metrics


def _figures(values: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.3f}" for name, value in values.items())


def _card(name: str, model: KeywordSpotter, config: KeywordsConfig, metrics: dict[str, Any], memory: str,
          command: str) -> str:
    sizes, pex, by = metrics["sizes"], metrics["partial_execution"], metrics["test_accuracy_by"]
    return f"""# {name}

A spoken-digit spotter: MLPerf Tiny's DS-CNN shape ({config.model.blocks} depthwise-separable blocks of
{config.model.channels} channels, {sum(p.numel() for p in model.parameters()):,} parameters) over one second's MFCCs
normalised per clip (`asr.keywords.keyword_features`), labels {", ".join(DIGIT_WORDS)}.

- Made by: `{command}` ({metrics['train_seconds']} s of training, {metrics['steps']} steps of {config.train.global_batch_size})
- Data: the Free Spoken Digit Dataset (CC BY-SA 4.0) less speakers {", ".join(config.held_out)}, with
  {config.espeak_voices} espeak-ng voices and flite's voices at {len(config.flite_speeds)} speeds saying the digits:
  {sizes['train']:,} training clips, {sizes['validation']:,} validation
- Held-out speakers ({sizes['test']:,} clips never trained on): accuracy {metrics['test_accuracy']:.4f};
  by speaker {_figures(by['speaker'])}; by digit {_figures(by['digit'])}; each clip in evaluation.tsv
- Partial execution (`zoo.partial`): arena {pex['baseline_bytes']:,} B sequential, {pex['peak_bytes']:,} B split
  ({pex['macs']:,} multiply-accumulates a clip); the executor's arena {pex['arena_bytes']:,} B gives the model's
  prediction on every held-out clip: {pex['same_predictions']}; streamed a row at a time (`zoo.partial.stream`)
  in {pex['row_stream_bytes']:,} B a clip ({pex['row_stream_products']:,} products a clip, those on padding left
  out), the model's prediction on every held-out clip: {pex['row_stream_same_predictions']}

## Memory per rank (measured in training step 2)

{memory}

Use it with `zoo spot {name} WAV...` (one spoken digit a file, any rate), or
`zoo.load("{name}")(input_features)["logits"]` with input_features from `asr.keywords.keyword_features`.
"""


RECIPE = Recipe(name="keywords", config_class=KeywordsConfig, run=run, produces=("kws-digits",),
                description="train a DS-CNN keyword spotter on spoken digits (FSDD speakers held out), run it under Pex")

if __name__ == "__main__":
    run(KeywordsConfig())
