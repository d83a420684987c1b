"""Recipe `translation`: translators of software messages, from the gettext catalogues of Debian's
packages (`nlp.translation.catalogues`).

    zoo train translation                      the default: English -> German from scratch
    zoo train translation --task finetune      translator-opus-zh-en fine-tuned on Chinese -> English
                                               compiler and version-control messages

scratch: the English -> `language` pairs of the `catalogues` programs (by default gcc, git,
binutils, gnupg, vim, Inkscape and LibreOffice), each English message once; a sentencepiece model
of `vocab_size` pieces trained on both sides; a `Translator` of shape `model` trained from its
initialisation. Evaluated on `held_out_fraction` of those pairs (drawn with the seed, never trained
on) and on the catalogue of a program never trained on (`held_out_catalogue`, GIMP: its messages
whose English the training pairs lack).
finetune: `base` (OPUS-MT zh -> en) trained further on the Chinese -> English pairs of the
`finetune_catalogues` programs (gcc, git: a domain of compiler and version-control messages),
evaluated on `held_out_fraction` of them before and after.

Both report sacrebleu's corpus BLEU and chrF (4 beams) and each sentence's, and write the model
(weights, config with tokenizer and metrics, card, every evaluated sentence in `evaluation.tsv`)
into the user's zoo.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import sacrebleu
import torch

import zoo
from nlp.data import pad_sequences
from nlp.translation import Translator, TranslatorConfig
from nlp.translation.catalogues import CATALOGUES, catalogue_pairs
from nlp.translation.decode import BeamSettings
from nlp.translation.tokenizer import EOS_ID, MODEL_FILE, PAD_ID, folder_tokenizer, train_sentencepiece
from nlp.translation.translate import load_translator, translate
from recipes.report import trainer_memory_report
from trainers import Strategy, TrainConfig, Trainer
from trainers.loop.data import first_micro_batch
from zoo.nn.cross_entropy import IGNORE_INDEX
from zoo.recipes import Recipe, command_line
from zoo.store import user_zoo_dir

log = logging.getLogger(__name__)

Pair = tuple[str, str]


@dataclass
class TranslationConfig:
    """Settings of the recipe; every field can be set with `zoo train translation --a.b value`."""

    task: Literal["scratch", "finetune"] = "scratch"
    """"scratch": train English -> `language` from nothing; "finetune": fine-tune `base` (module docstring)."""
    language: str = "de"
    """scratch: the gettext locale translated into."""
    catalogues: tuple[str, ...] = ("gcc", "git", "binutils", "gnupg", "vim", "inkscape", "libreoffice")
    """scratch: the programs whose catalogues train (and give the held-out split)."""
    held_out_catalogue: str = "gimp"
    """scratch: the program whose catalogue is never trained on, evaluated on."""
    base: str = "translator-opus-zh-en"
    """finetune: the zoo translator fine-tuned."""
    finetune_catalogues: tuple[str, ...] = ("gcc", "git")
    """finetune: the programs whose zh_CN catalogues give the new domain's Chinese -> English pairs."""
    held_out_fraction: float = 0.02
    """Share of the training programs' pairs held out for evaluation."""
    max_tokens: int = 64
    """Pairs whose source or target exceeds this many tokens (EOS included) are left out."""
    vocab_size: int = 8000
    """scratch: sentencepiece pieces (source and target share them)."""
    model: TranslatorConfig = field(default_factory=lambda: TranslatorConfig(
        vocab_size=8000, width=256, heads=4, encoder_layers=3, decoder_layers=3, ffn_width=1024, max_positions=128,
        dropout=0.1, label_smoothing=0.1, pad_token_id=PAD_ID, decoder_start_token_id=PAD_ID, eos_token_id=EOS_ID))
    """scratch: the translator's shape (vocab_size follows `vocab_size`)."""
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        global_batch_size=64, micro_batch_size=64, max_steps=6000, lr=1e-3, warmup_steps=400, weight_decay=0.01,
        betas=(0.9, 0.98), grad_clip=1.0, log_every=100, eval_every=1000, eval_batches=8,
        output_dir="runs/translation"))
    """Optimisation settings (finetune: lower the learning rate, e.g. --train.lr 5e-5)."""
    strategy: Strategy = field(default_factory=lambda: Strategy(zero=1))
    """Memory strategy."""
    beams: int = 4
    """Beam size of the evaluation's translations."""
    evaluation_sentences: int = 500
    """Sentences of each evaluation set translated (0: all)."""
    output: str = ""
    """Model folder to write; empty: the recipe's zoo entry in the user's zoo."""

    def __post_init__(self) -> None:
        if not 0.0 < self.held_out_fraction < 0.5:
            raise ValueError(f"held_out_fraction must be in (0, 0.5); got {self.held_out_fraction}")
        for name in (*self.catalogues, self.held_out_catalogue, *self.finetune_catalogues):
            if name not in CATALOGUES:
                raise ValueError(f"catalogue {name!r} is not one of {sorted(CATALOGUES)}")
        if self.held_out_catalogue in self.catalogues:
            raise ValueError(f"held_out_catalogue {self.held_out_catalogue!r} is also in catalogues {self.catalogues}")
        if self.max_tokens < 2 or self.evaluation_sentences < 0 or self.beams < 1:
            raise ValueError(f"max_tokens must be >= 2, evaluation_sentences >= 0 and beams >= 1; got "
                             f"{self.max_tokens}, {self.evaluation_sentences}, {self.beams}")


def programs_pairs(programs: tuple[str, ...], language: str, reverse: bool = False) -> list[Pair]:
    """Every (source, target) pair of the programs' catalogues, each source once (the first
    program's); `reverse`: the translation is the source and the English the target."""
    found: dict[str, str] = {}
    for program in programs:
        for english, translated in catalogue_pairs(program, language):
            source, target = (translated, english) if reverse else (english, translated)
            found.setdefault(source, target)
    return list(found.items())


def shuffled(pairs: list[Pair], seed: int) -> list[Pair]:
    """`pairs` in the order of a permutation drawn with `seed`."""
    return [pairs[i] for i in torch.randperm(len(pairs), generator=torch.Generator().manual_seed(seed)).tolist()]


def held_out_split(pairs: list[Pair], fraction: float, seed: int) -> tuple[list[Pair], list[Pair]]:
    """(training pairs, held-out pairs): `fraction` of `pairs` drawn with `seed`."""
    order, cut = shuffled(pairs, seed), int(len(pairs) * fraction)
    return order[cut:], order[:cut]


def encode_pairs(pairs: list[Pair], tokenizer, max_tokens: int) -> tuple[list[dict[str, torch.Tensor]], list[Pair]]:
    """(examples {"input_ids", "labels"} with EOS closing both, the pairs kept): pairs whose source
    or target exceeds `max_tokens` tokens are left out."""
    examples, kept = [], []
    for source, target in pairs:
        ids, labels = tokenizer.encode(source, eos=True), tokenizer.encode(target, eos=True)
        if len(ids) <= max_tokens and len(labels) <= max_tokens:
            examples.append({"input_ids": torch.tensor(ids), "labels": torch.tensor(labels)})
            kept.append((source, target))
    return examples, kept


def translation_collate(pad_id: int):
    """A collate function for `encode_pairs` examples: input_ids padded with `pad_id` beside their
    attention_mask (`nlp.data.pad_sequences`, whose segment ids a translator does not take), labels
    padded with -100, each (B, longest)."""

    def collate(examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        batch = pad_sequences([e["input_ids"] for e in examples], pad_id)
        del batch["token_type_ids"]
        batch["labels"] = torch.nn.utils.rnn.pad_sequence([e["labels"] for e in examples], batch_first=True,
                                                          padding_value=IGNORE_INDEX)
        return batch

    return collate


def scores(model: Translator, tokenizer, pairs: list[Pair], beams: int) -> dict[str, Any]:
    """Corpus BLEU and chrF of the model's translations of `pairs` (sacrebleu, 13a tokenisation),
    and each sentence's source, reference, translation, BLEU and chrF."""
    model.eval()
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    hypotheses = translate(model, tokenizer, sources, BeamSettings(beams=beams, max_length_ratio=3.0), batch_size=32)
    sentences = [{"source": s, "reference": r, "translation": h,
                  "bleu": sacrebleu.sentence_bleu(h, [r]).score, "chrf": sacrebleu.sentence_chrf(h, [r]).score}
                 for s, r, h in zip(sources, references, hypotheses)]
    return {"bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
            "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score, "sentences": sentences}


def _first(pairs: list[Pair], count: int) -> list[Pair]:
    return pairs if count == 0 else pairs[:count]


@dataclass
class TaskData:
    """What a task trains and evaluates."""

    tokenizer: Any
    model: Translator
    training: list[dict[str, torch.Tensor]]
    """Encoded training pairs (`encode_pairs`)."""
    validation: list[dict[str, torch.Tensor]]
    """The encoded held-out split (its loss is logged as training goes)."""
    evaluation: dict[str, list[Pair]]
    """Pairs translated and scored after training, by set name."""
    sizes: dict[str, int]
    """Pairs found, trained on and held out."""


def _scratch_data(config: TranslationConfig, folder: Path) -> TaskData:
    pairs = programs_pairs(config.catalogues, config.language)
    training, held_out = held_out_split(pairs, config.held_out_fraction, config.train.seed)
    train_sentencepiece([text for pair in training for text in pair], config.vocab_size, folder)
    tokenizer = folder_tokenizer(folder, ("en", config.language.split("_")[0]))
    examples, kept = encode_pairs(training, tokenizer, config.max_tokens)
    validation, held_out = encode_pairs(held_out, tokenizer, config.max_tokens)
    seen = {source for source, _ in pairs}
    unseen = [pair for pair in programs_pairs((config.held_out_catalogue,), config.language) if pair[0] not in seen]
    _, unseen = encode_pairs(shuffled(unseen, config.train.seed), tokenizer, config.max_tokens)
    torch.manual_seed(config.train.seed)
    model = Translator(dataclasses.replace(config.model, vocab_size=tokenizer.vocab_size))
    evaluation = {"held_out_split": _first(held_out, config.evaluation_sentences),
                  config.held_out_catalogue: _first(unseen, config.evaluation_sentences)}
    sizes = {"pairs": len(pairs), "training_pairs": len(kept), "held_out_split": len(held_out),
             config.held_out_catalogue: len(unseen)}
    return TaskData(tokenizer, model, examples, validation, evaluation, sizes)


def _finetune_data(config: TranslationConfig) -> TaskData:
    model, tokenizer = load_translator(config.base)
    pairs = programs_pairs(config.finetune_catalogues, "zh_CN", reverse=True)
    training, held_out = held_out_split(pairs, config.held_out_fraction, config.train.seed)
    examples, kept = encode_pairs(training, tokenizer, config.max_tokens)
    validation, held_out = encode_pairs(held_out, tokenizer, config.max_tokens)
    return TaskData(tokenizer, model, examples, validation, {"held_out_split": _first(held_out, config.evaluation_sentences)},
                    {"pairs": len(pairs), "training_pairs": len(kept), "held_out_split": len(held_out)})


def run(config: TranslationConfig) -> dict[str, Any]:
    """Prepare the data, train, evaluate, report memory, save the model. Call on every rank."""
    with tempfile.TemporaryDirectory() as scratch_folder:
        if config.task == "scratch":
            data = _scratch_data(config, Path(scratch_folder))
            piece_model = (Path(scratch_folder) / MODEL_FILE).read_bytes()
        else:
            data, piece_model = _finetune_data(config), None
    tokenizer, model, evaluation, sizes = data.tokenizer, data.model, data.evaluation, data.sizes
    log.info("translation pairs: %s", ", ".join(f"{v:,} {k}" for k, v in sizes.items()))
    before = ({name: scores(model, tokenizer, pairs, config.beams) for name, pairs in evaluation.items()}
              if config.task == "finetune" else {})
    collate = translation_collate(model.filler_token_id)
    trainer = Trainer(model.train(), config.train, config.strategy,
                      example_batch=first_micro_batch(data.training, config.train.micro_batch_size, collate))
    history = trainer.fit(data.training, data.validation, collate_fn=collate)
    state = trainer.full_state_dict()
    if not trainer.env.is_main:
        return {}
    memory = trainer_memory_report(trainer)
    trained = Translator(model.config)
    trained.load_state_dict(state)
    after = {name: scores(trained, tokenizer, pairs, config.beams) for name, pairs in evaluation.items()}
    metrics = {"sizes": sizes, "steps": trainer.step, "train_loss": history[-1]["loss"],
               "examples_seen": trainer.step * config.train.global_batch_size,
               **{f"{name}_{kind}": result[kind] for name, result in after.items() for kind in ("bleu", "chrf")},
               **{f"{name}_{kind}_before": result[kind] for name, result in before.items() for kind in ("bleu", "chrf")}}
    name = f"translator-catalogues-en-{config.language.split('_')[0]}" if config.task == "scratch" else \
        f"{config.base}-software"
    output = Path(config.output) if config.output else user_zoo_dir() / name
    command = command_line(RECIPE, config, trainer.env.world_size)
    languages = list(tokenizer.languages)
    files = {"evaluation.tsv": _evaluation_table(after, before).encode()}
    if piece_model is not None:
        files[MODEL_FILE] = piece_model
    card = _card(output.name, trained, config, metrics, after, before, memory, command)
    zoo.save(trained, output, card=card, files=files,
             extra={"tokenizer": tokenizer.spec(), "languages": languages, "metrics": metrics})
    for set_name, result in after.items():
        was = f" (before: {before[set_name]['bleu']:.1f} / {before[set_name]['chrf']:.1f})" if set_name in before else ""
        print(f"{set_name}: BLEU {result['bleu']:.1f}, chrF {result['chrf']:.1f}{was}")
    print("\nmemory per rank, measured in training step 2 vs the ZeRO-paper estimate:\n" + memory)
    print(f"\nsaved {output}")
    return metrics


def _evaluation_table(after: dict[str, Any], before: dict[str, Any]) -> str:
    """Every evaluated sentence, tab-separated: set, source, reference, translation, BLEU, chrF
    (and the translation, BLEU and chrF before fine-tuning)."""
    clean = lambda text: " ".join(str(text).split())  # noqa: E731 (no tabs or newlines inside a cell)
    rows = ["set\tsource\treference\ttranslation\tbleu\tchrf" + ("\tbefore\tbleu_before\tchrf_before" if before else "")]
    for set_name, result in after.items():
        earlier = before.get(set_name, {}).get("sentences", [None] * len(result["sentences"]))
        for now, then in zip(result["sentences"], earlier):
            cells = [set_name, now["source"], now["reference"], now["translation"], f"{now['bleu']:.1f}", f"{now['chrf']:.1f}"]
            if then is not None:
                cells += [then["translation"], f"{then['bleu']:.1f}", f"{then['chrf']:.1f}"]
            rows.append("\t".join(map(clean, cells)))
    return "\n".join(rows) + "\n"


def _card(name: str, model: Translator, config: TranslationConfig, metrics: dict[str, Any], after: dict[str, Any],
          before: dict[str, Any], memory: str, command: str) -> str:
    sizes = metrics["sizes"]
    parameters = sum(p.numel() for p in model.parameters())
    if config.task == "scratch":
        origin = (f"A `Translator` ({parameters / 1e6:.1f} M parameters) trained from its initialisation on the "
                  f"{sizes['training_pairs']:,} English -> {config.language} message pairs of the Debian catalogues of "
                  f"{', '.join(config.catalogues)} (at most {config.max_tokens} tokens a side; a {config.vocab_size:,}-piece "
                  f"sentencepiece model trained on them).")
    else:
        origin = (f"`{config.base}` ({parameters / 1e6:.1f} M parameters) fine-tuned on the {sizes['training_pairs']:,} "
                  f"Chinese -> English message pairs of the Debian zh_CN catalogues of {', '.join(config.finetune_catalogues)}.")
    lines = []
    for set_name, result in after.items():
        was = (f" (before fine-tuning: BLEU {before[set_name]['bleu']:.1f}, chrF {before[set_name]['chrf']:.1f})"
               if set_name in before else "")
        lines.append(f"  - `{set_name}` ({len(result['sentences'])} sentences): BLEU {result['bleu']:.1f}, "
                     f"chrF {result['chrf']:.1f}{was}")
    examples = []
    for set_name, result in after.items():
        for sentence in result["sentences"][:5]:
            examples.append(f"| {set_name} | {sentence['source']} | {sentence['reference']} | {sentence['translation']} | "
                            f"{sentence['bleu']:.1f} |".replace("\n", " "))
    return f"""# {name}

{origin}

- Made by: `{command}`
- Training: {metrics['steps']} steps of {config.train.global_batch_size} pairs ({metrics['examples_seen']:,} pairs seen);
  last training loss {metrics['train_loss']:.4f}
- Evaluation (4 beams unless the command says otherwise; sacrebleu corpus BLEU and chrF, 13a):
{chr(10).join(lines)}

Every evaluated sentence, with its own BLEU and chrF, is in `evaluation.tsv`; the first of each set:

| set | source | reference | translation | BLEU |
|---|---|---|---|---|
{chr(10).join(examples)}

## Memory per rank (measured in training step 2)

{memory}

`zoo translate {name} "text"` translates with it.
"""


RECIPE = Recipe(name="translation", config_class=TranslationConfig, run=run,
                produces=("translator-catalogues-en-de", "translator-opus-zh-en-software"),
                description="translators of software messages from Debian's catalogues (en->de from scratch; zh->en fine-tuned)")

if __name__ == "__main__":
    run(TranslationConfig())
