"""Recipe `asr_transducer`: a Conformer transducer trained on speech synthesised with espeak-ng.

    zoo train asr_transducer                              the default: tiny Conformer, characters, pruned loss (1,800 steps; 0.73-0.91 s a step on 2 cores)
    zoo train asr_transducer --nproc 2 --strategy.zero 2 --model.loss samplewise
    zoo train asr_transducer --encoder whisper-tiny.en --corpus.text modern --tokens bpe --lm_unit token --head_steps 2500
                                                          Whisper tiny.en's encoder, fine-tuned on modern English
                                                          after the head trained alone on its frozen outputs
    zoo train asr_transducer ... --init NAME --evaluate_only true --lexicon_penalties 0,5,10,15 --lm_sources wordnet
                                                          train nothing: evaluate a saved recogniser anew (only the
                                                          evaluated sets are synthesised), its language model read
                                                          anew (here with WordNet's usage examples too), its
                                                          decoding (LM weight, soft lexicon) chosen on validation

Data (`asr.data`): Shakespeare sentences within the corpus's 2,000 most frequent words (or, with
--corpus.text modern, the open-vocabulary sentences of six text sources, `asr.training_text`), each
spoken by a random espeak-ng voice (accent, variant, speed, pitch). Reports the word error rate of
greedy search, modified beam search, and beam search fused with a word 4-gram language model of
the training transcripts, spelled through their lexicon (`asr.word_language_model`), less the
model's internal language model, on held-out sentences spoken by training voices, on the same
sentences spoken by unseen speakers (two voice variants never trained on, in the training accents)
and in an unseen accent (West Midlands), on a text source never trained on spoken by unseen speakers
(modern text), and on the real recordings of Debian `pocketsphinx-testdata`;
writes the model (weights with the feature statistics, tokenizer, front end, metrics, card) into
the user's zoo as `asr-transducer-tiny`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

import zoo
from asr.data import (DurationBuckets, SpeechExamples, build_corpus, collate_speech, corpus_plan, language_model_sentences,
                      load_manifest, recorded_speech, sentence_sources, training_text_sentences)
from asr.decoding_tuning import BeamSearch, TuningFold, tuned_lexicon_penalty, tuned_lm_weight, tuned_rescoring
from asr.encoder_cache import EncodedExamples
from asr.evaluation import word_error_rates
from asr.features import FeatureConfig
from asr.language_model import LanguageModel, NgramLanguageModel
from asr.lexicon import LexiconPenalty, lexicon_bytes, lexicon_words
from asr.model import Transducer, TransducerConfig
from asr.text import TranscriptTokenizer
from asr.transcription import LANGUAGE_MODEL_FILE, LEXICON_FILE, recogniser
from asr.whisper_encoder import WhisperEncoder, WhisperEncoderConfig, packaged_whisper_tiny_en
from asr.whisper_rescoring import Rescoring
from asr.word_language_model import WordLanguageModel
from recipes.asr_transducer_card import RECORDED, model_card
from recipes.asr_transducer_config import ASRTransducerConfig
from recipes.report import trainer_memory_report
from trainers import TrainConfig, Trainer
from trainers.state.checkpoint import resume_candidates
from trainers.loop.data import first_micro_batch
from trainers.parallel.mesh import from_main_rank
from zoo.recipes import Recipe, command_line
from zoo.store import read_config, user_zoo_dir

log = logging.getLogger(__name__)

def model_config(config: ASRTransducerConfig, vocab_size: int) -> TransducerConfig:
    """The transducer config.model describes with `vocab_size` tokens; with encoder "whisper-tiny.en",
    on Whisper tiny.en's encoder shape (WhisperEncoderConfig's defaults)."""
    if config.encoder == "conformer":
        return dataclasses.replace(config.model, vocab_size=vocab_size)
    return dataclasses.replace(config.model, vocab_size=vocab_size, encoder_kind="whisper", encoder=WhisperEncoderConfig())


def build_model(config: ASRTransducerConfig, vocab_size: int) -> Transducer:
    """A new transducer of `model_config`: with encoder "whisper-tiny.en", its encoder holds Whisper
    tiny.en's pretrained weights (the rest random)."""
    model = Transducer(model_config(config, vocab_size))
    if config.encoder == "whisper-tiny.en":
        pretrained = WhisperEncoder.from_ctranslate2(packaged_whisper_tiny_en())
        if pretrained.config != model.config.encoder:
            raise ValueError(f"the packaged Whisper tiny.en encoder is {pretrained.config}; expected {model.config.encoder}")
        model.encoder.load_state_dict(pretrained.state_dict())
    return model


def pretrained_anchor(config: ASRTransducerConfig, model: Transducer) -> dict[str, torch.Tensor] | None:
    """Where train.anchor_decay pulls the encoder's parameters back to: with encoder "whisper-tiny.en",
    Whisper tiny.en's pretrained weights, also when training starts from --init (L2-SP's "starting
    point" is the pretrained model, not a fine-tuned one). None otherwise: the trainer then anchors
    every parameter where training starts, as it does the head's here."""
    if config.encoder != "whisper-tiny.en" or not config.train.anchor_decay:
        return None
    encoder = WhisperEncoder.from_ctranslate2(packaged_whisper_tiny_en()).state_dict()
    names = {name for name, p in model.named_parameters() if p.requires_grad and config.train.anchor_strength(name)}
    return {f"encoder.{name}": value for name, value in encoder.items() if f"encoder.{name}" in names}


def initial_model(config: ASRTransducerConfig, tokenizer: TranscriptTokenizer) -> Transducer:
    """The model training starts from: `build_model`'s, or with config.init the recogniser it names,
    refused (ValueError naming what differs) unless its tokens and architecture are this run's."""
    if not config.init:
        return build_model(config, tokenizer.vocab_size)
    found, expected = recogniser(config.init), model_config(config, tokenizer.vocab_size)
    if found.tokenizer.spec() != tokenizer.spec():
        raise ValueError(f"--init {config.init!r} writes other output units than this run's --tokens "
                         f"{config.tokens} (--bpe_vocab_size {config.bpe_vocab_size}, learnt from --lm_text "
                         f"{config.lm_text}): {found.tokenizer.vocab_size} tokens against {tokenizer.vocab_size}, "
                         f"or other pieces")
    differ = [f"{name}: {getattr(found.model.config, name)!r} there, {getattr(expected, name)!r} here"
              for name in (f.name for f in dataclasses.fields(expected) if f.name != "warm_steps")
              if getattr(found.model.config, name) != getattr(expected, name)]
    if differ:
        raise ValueError(f"--init {config.init!r} is another architecture than this run's --encoder {config.encoder} "
                         f"and --model: {'; '.join(differ)}")
    return found.model


def feature_statistics(examples: SpeechExamples, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-bin mean and std (F,) of the log-mel frames of the first `count` examples."""
    frames = torch.cat([examples[i]["input_features"] for i in range(min(count, len(examples)))])
    return frames.mean(0), frames.std(0).clamp_min(1e-3)


def tuning_folds(config: ASRTransducerConfig, tokenizer: TranscriptTokenizer, rows: list[dict[str, Any]],
                 language_model: LanguageModel, words: frozenset[str]) -> list[TuningFold]:
    """The validation `rows` as config.lm_tuning decodes them: one fold with `language_model` and the
    lexicon `words` (both of the whole text), or one per text source with a language model and
    lexicon of the training text less that source's sentences, beside config.lm_sources'."""
    lexicon = lexicon_words if config.lexicon_penalties else (lambda _: frozenset())
    if config.lm_tuning == "validation":
        return [TuningFold(rows, language_model, words)]
    sources = sentence_sources(config.corpus, "validation")
    unknown = [row["text"] for row in rows if row["text"] not in sources]
    if unknown:
        raise ValueError(f"lm_tuning 'leave_source_out' needs each validation sentence's source; "
                         f"{len(unknown)} are in no source's validation split, e.g. {unknown[0]!r}")
    wider = language_model_sentences(config.corpus, config.lm_sources) if config.lm_sources else []
    folds = []
    for source in sorted({sources[row["text"]] for row in rows}):
        fold_text = training_text_sentences(config.corpus, without=source) + wider
        folds.append(TuningFold([row for row in rows if sources[row["text"]] == source],
                                train_language_model(config, tokenizer, fold_text), lexicon(fold_text)))
        log.info("leave-one-source-out fold %s: %d utterances, a language model of %d sentences", source,
                 len(folds[-1].rows), len(fold_text))
    return folds


def train_language_model(config: ASRTransducerConfig, tokenizer: TranscriptTokenizer,
                         transcripts: list[str]) -> LanguageModel | None:
    """The recipe's language model of the training `transcripts` (None when lm_order is 0)."""
    if not config.lm_order:
        return None
    if config.lm_unit == "word":
        return WordLanguageModel.train(transcripts, config.lm_order)
    return NgramLanguageModel.train([tokenizer.encode(t) for t in transcripts], tokenizer.vocab_size, config.lm_order)


def head_train_config(train: TrainConfig, steps: int, lr: float, head: Transducer) -> TrainConfig:
    """`train` for the head_steps: their own step count and peak learning rate, the learning-rate
    scales and anchor decays of the parameters that train in them (not the frozen encoder's), and
    their own output and checkpoint folders (a `head` subfolder of each)."""
    names = [name for name, p in head.named_parameters() if p.requires_grad]
    scales, anchors = ({prefix: value for prefix, value in prefixes.items() if any(n.startswith(prefix) for n in names)}
                       for prefixes in (train.lr_scales, train.anchor_decay))
    return dataclasses.replace(train, max_steps=steps, lr=lr, warmup_steps=min(train.warmup_steps, steps), lr_scales=scales,
                               anchor_decay=anchors,
                               eval_every=min(train.eval_every, steps), output_dir=str(Path(train.output_dir) / "head"),
                               checkpoint_dir=train.checkpoint_dir and str(Path(train.checkpoint_dir) / "head"))


def train_head(config: ASRTransducerConfig, model: Transducer, train: SpeechExamples,
               validation: SpeechExamples) -> Transducer:
    """Train model's decoder, joiner and the pruned loss's linears for config.head_steps on the
    frozen encoder's outputs of config.head_views views of `train` (`asr.encoder_cache`; validation
    encoded plainly), then return a model of the trained weights on every rank, all trainable, whose
    pruned loss starts warm (warm_steps 0: its warm-up ran in the head steps). The head steps are
    skipped (model's weights kept) when resuming a run whose whole-model phase has a checkpoint."""
    warm = Transducer(dataclasses.replace(model.config, warm_steps=0))
    if config.train.resume and config.train.checkpoint_dir and resume_candidates(Path(config.train.checkpoint_dir)):
        warm.load_state_dict(model.state_dict())
        return warm
    rank = int(os.environ.get("RANK", "0"))
    encoded = EncodedExamples.build(model, train, config.head_views, seed=config.train.seed, first_view=rank)
    encoded_validation = EncodedExamples.build(model, validation, augmented=False, seed=config.train.seed)
    model.encoder.requires_grad_(False)
    buckets = DurationBuckets(encoded, config.bucket_size, config.train.seed)
    trainer = Trainer(model, head_train_config(config.train, config.head_steps, config.head_lr, model), config.strategy,
                      example_batch=first_micro_batch(buckets, config.train.micro_batch_size, collate_speech))
    trainer.fit(buckets, DurationBuckets(encoded_validation, config.bucket_size), collate_fn=collate_speech)
    warm.load_state_dict(from_main_rank(trainer.full_state_dict()))
    return warm


TRAINING_METRICS = ("validation_loss", "steps", "utterances_seen", "head_steps", "train_seconds", "train_hours")
"""What a model folder's metrics say of its training (an evaluate_only run copies them from --init)."""


def run(config: ASRTransducerConfig) -> dict[str, Any]:
    """Synthesise (once), train, evaluate, report memory, save the model. Call on every rank."""
    features = FeatureConfig()
    needs_train = not config.evaluate_only or config.lm_text == "transcripts"
    splits = tuple(s for s in config.corpus.splits if s != "train" or needs_train)
    folder = build_corpus(config.corpus, splits=splits)  # an evaluation synthesises no training speech
    manifests = {split: load_manifest(folder / f"{split}.jsonl") for split in splits}
    text = (list(manifests["train"]["text"]) if config.lm_text == "transcripts"
            else training_text_sentences(config.corpus))
    tokenizer = (TranscriptTokenizer("char") if config.tokens == "char"
                 else TranscriptTokenizer.train_bpe(text, config.bpe_vocab_size))
    if config.lm_sources:  # the tokenizer has learnt its pieces; the language model reads more
        text = text + language_model_sentences(config.corpus, config.lm_sources)
    torch.manual_seed(config.train.seed)
    model = initial_model(config, tokenizer)
    if config.evaluate_only:
        if int(os.environ.get("RANK", "0")):
            return {}
        trained = read_config(config.init)["metrics"]
        training = {name: trained[name] for name in TRAINING_METRICS} | {"train_utterances": trained["sizes"]["train"]}
        memory = f"Not measured: this folder's weights are `{config.init}`'s, evaluated anew (see its card)."
        return evaluate_and_save(config, model, tokenizer, features, manifests, text, training, memory, 1)
    log.info("reading and checking %d training and %d validation clips", len(manifests["train"]["text"]),
             len(manifests["validation"]["text"]))
    train = SpeechExamples(manifests["train"], tokenizer, features, augment=config.augment)
    validation = SpeechExamples(manifests["validation"], tokenizer, features)
    if model.config.encoder_kind == "conformer" and not config.init:
        model.set_feature_stats(*feature_statistics(train, config.stats_utterances))
    buckets = DurationBuckets(train, config.bucket_size, config.train.seed)
    started = time.perf_counter()
    if config.head_steps:
        model = train_head(config, model, train, validation)
    trainer = Trainer(model, config.train, config.strategy,
                      example_batch=first_micro_batch(buckets, config.train.micro_batch_size, collate_speech),
                      anchor=pretrained_anchor(config, model))
    history = trainer.fit(buckets, DurationBuckets(validation, config.bucket_size), collate_fn=collate_speech)
    train_seconds = time.perf_counter() - started
    state = trainer.full_state_dict()
    if not trainer.env.is_main:
        return {}

    memory = trainer_memory_report(trainer)
    model = Transducer(model.config)
    model.load_state_dict(state)
    training = {"validation_loss": [r for r in history if "eval_loss" in r][-1]["eval_loss"], "steps": trainer.step,
                "utterances_seen": trainer.step * config.train.global_batch_size * config.bucket_size,
                "head_steps": config.head_steps, "train_seconds": round(train_seconds, 1),
                "train_hours": round(sum(train.seconds) / 3600, 2), "train_utterances": len(train)}
    return evaluate_and_save(config, model, tokenizer, features, manifests, text, training, memory, trainer.env.world_size)


def evaluate_and_save(config: ASRTransducerConfig, model: Transducer, tokenizer: TranscriptTokenizer,
                      features: FeatureConfig, manifests: dict[str, Any], text: list[str], training: dict[str, Any],
                      memory: str, world_size: int) -> dict[str, Any]:
    """Choose the language-model weight and lexicon penalty on validation, measure the word error rates
    of every held-out set and the real recordings, and save the model folder (weights, tokenizer,
    decoding settings, language model, lexicon, metrics with `training`'s figures, card). Returns the metrics."""
    limit = config.evaluation_utterances or None
    recorded = recorded_speech()
    sets = {split: list(manifests[split]) for split in config.corpus.splits if split != "train"}
    sets |= {name: [r for r in recorded if r["set"] == name] for name in RECORDED}
    language_model = train_language_model(config, tokenizer, text)
    lm_weight, tried, penalty, penalties_tried, tuning = config.lm_weight, {}, 0.0, {}, []
    rescoring, rescorings_tried = Rescoring(), {}
    words = lexicon_words(text) if language_model is not None and config.lexicon_penalties else frozenset()
    if language_model is not None and (config.lm_weights or config.lexicon_penalties or config.rescore_weights):
        search = BeamSearch(config.beam, config.ilm_weight, features)
        tuning = [row for name in config.tuning_sets for row in sets[name][:config.tuning_utterances or limit]]
        folds = tuning_folds(config, tokenizer, tuning, language_model, words)
        if config.lm_weights:
            lm_weight, tried = tuned_lm_weight(model, tokenizer, folds, config.lm_weights, search)
            log.info("language-model weight %s chosen (%s): WER %s", lm_weight, config.lm_tuning, tried)
        if config.lexicon_penalties:
            penalty, penalties_tried = tuned_lexicon_penalty(model, tokenizer, folds, config.lexicon_penalties,
                                                             lm_weight, search)
            log.info("lexicon penalty %s chosen (%s): WER %s", penalty, config.lm_tuning, penalties_tried)
        if config.rescore_weights:
            grid = [Rescoring(w, b, t) for w in config.rescore_weights for b in config.rescore_bonuses
                    for t in config.rescore_transcript]
            rescoring, rescorings_tried = tuned_rescoring(model, tokenizer, folds, grid, lm_weight, penalty, search)
            log.info("Whisper rescoring %s chosen (%s): WER %s", rescoring, config.lm_tuning, rescorings_tried)
    fused = LexiconPenalty(language_model, tokenizer, words, penalty) if penalty else language_model
    metrics: dict[str, Any] = {name: word_error_rates(model, rows[:limit], tokenizer, features, config.beam,
                                                      fused, lm_weight, config.ilm_weight, rescoring)
                                    for name, rows in sets.items()}
    metrics["lm_weight"], metrics["lm_weight_validation_wer"] = lm_weight, tried
    metrics["lexicon_penalty"], metrics["lexicon_penalty_validation_wer"] = penalty, penalties_tried
    metrics["rescoring"], metrics["rescoring_validation_wer"] = dataclasses.asdict(rescoring), rescorings_tried
    metrics["lm_tuning"], metrics["tuning_utterances"] = config.lm_tuning, len(tuning)
    metrics["tuning_sets"] = list(config.tuning_sets)
    metrics.update({name: training[name] for name in TRAINING_METRICS})
    metrics["sizes"] = {name: len(rows) for name, rows in sets.items()} | {"train": training["train_utterances"]}
    metrics["lexicon_words"] = len(words) if penalty else 0
    output = Path(config.output) if config.output else user_zoo_dir() / "asr-transducer-tiny"
    command = command_line(RECIPE, config, world_size)
    training_voices = [voice.name for _, voice in corpus_plan(config.corpus)[0]["train"]]
    card = model_card(output.name, model, config, metrics, memory, world_size, command, training_voices)
    has_lm = language_model is not None
    decoding = {"beam": config.beam, "lm_weight": lm_weight if has_lm else 0.0, "ilm_weight": config.ilm_weight if has_lm else 0.0,
                "lm_unit": config.lm_unit, "lm_order": config.lm_order, "lexicon_penalty": penalty,
                "rescoring": dataclasses.asdict(rescoring)}
    files = {LANGUAGE_MODEL_FILE: language_model.to_bytes()} if has_lm else {}
    if penalty:
        files[LEXICON_FILE] = lexicon_bytes(words)
    zoo.save(model, output, card=card, extra={"tokenizer": tokenizer.spec(), "features": dataclasses.asdict(features),
                                              "decoding": decoding, "metrics": metrics}, files=files or None)
    second = " / + Whisper rescoring" if rescoring.weight else ""
    print(f"\nword error rate (greedy / beam / beam + language model{second}):")
    for name in sets:
        rescored = f" / {metrics[name]['rescored_wer']:.4f}" if rescoring.weight else ""
        print(f"  {name:15s} {metrics[name]['greedy_wer']:.4f} / {metrics[name]['beam_wer']:.4f} / "
              f"{metrics[name]['lm_wer']:.4f}{rescored} ({metrics[name]['utterances']} utterances)")
    heading = "memory" if config.evaluate_only else "memory per rank, measured in training step 2 vs the ZeRO-paper estimate"
    print(f"\n{heading}:\n{memory}")
    print(f"\nsaved {output}")
    return metrics


RECIPE = Recipe(name="asr_transducer", config_class=ASRTransducerConfig, run=run, produces=("asr-transducer-tiny",),
                description="Conformer transducer on espeak-ng speech (held-out sentences and voices, real recordings)")

if __name__ == "__main__":
    run(ASRTransducerConfig())
