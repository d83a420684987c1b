"""Choosing the fusion's settings (language-model weight, lexicon penalty) by the word error rate of
beam search on development utterances, in folds that each decode with a language model of their own.

One fold of every validation utterance with the shipped language model is the plain protocol. One
fold per text source, whose language model (and lexicon) never read that source's sentences
(`asr.data.training_text_sentences(config, without=source)`), measures what the fusion gives text it
has not seen, as the held-out domain is: the plain protocol rewards a language model for having
read the validation sentences' neighbours. Errors are pooled over the folds.

    tuned_lm_weight(model, tokenizer, folds, weights, search) -> (weight, {"weight": WER})
    tuned_lexicon_penalty(model, tokenizer, folds, penalties, lm_weight, search) -> (penalty, {"penalty": WER})
    tuned_rescoring(model, tokenizer, folds, grid, lm_weight, penalty, search) -> (Rescoring, {Rescoring.key: WER})
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from asr.data import read_audio
from asr.features import FeatureConfig
from asr.language_model import LanguageModel
from asr.lexicon import LexiconPenalty
from asr.model import Transducer
from asr.text import TranscriptTokenizer
from asr.transcription import Recogniser, second_pass_candidates, segment_hypotheses, transcribe
from asr.whisper_rescoring import Rescoring, best_rescored
from asr.wer import error_counts


@dataclass(frozen=True)
class BeamSearch:
    """The beam search whose fusion is tuned."""

    beam: int
    """Hypotheses kept (modified beam search)."""
    ilm_weight: float
    """Weight of the internal language model subtracted in the fusion."""
    features: FeatureConfig = field(default_factory=FeatureConfig)
    """Features the model reads (their sample rate is the audio's)."""


@dataclass(frozen=True)
class TuningFold:
    """Development utterances and the language model (and lexicon) that decodes them."""

    rows: list[dict[str, Any]]
    """Utterances {"audio", "text"}."""
    language_model: LanguageModel
    """Fused into the beam search of these utterances."""
    words: frozenset[str] = frozenset()
    """Lexicon of the penalty tuning (`asr.lexicon.lexicon_words` of this fold's language-model text)."""


def tuned_lm_weight(model: Transducer, tokenizer: TranscriptTokenizer, folds: list[TuningFold],
                    weights: tuple[float, ...], search: BeamSearch) -> tuple[float, dict[str, float]]:
    """(the weight of `weights` of the lowest WER pooled over `folds`, the smallest of equals;
    {str(weight): WER})."""
    return _lowest_wer(model, tokenizer, folds, weights, search, lambda fold, weight: (fold.language_model, weight))


def tuned_lexicon_penalty(model: Transducer, tokenizer: TranscriptTokenizer, folds: list[TuningFold],
                          penalties: tuple[float, ...], lm_weight: float, search: BeamSearch
                          ) -> tuple[float, dict[str, float]]:
    """(the penalty of `penalties` for a word finished outside each fold's lexicon, with its language
    model at lm_weight, of the lowest pooled WER, the smallest of equals; {str(penalty): WER})."""
    return _lowest_wer(model, tokenizer, folds, penalties, search, lambda fold, penalty: (
        LexiconPenalty(fold.language_model, tokenizer, fold.words, penalty), lm_weight))


def _lowest_wer(model: Transducer, tokenizer: TranscriptTokenizer, folds: list[TuningFold], values: tuple[float, ...],
                search: BeamSearch, fusion: Callable[[TuningFold, float], tuple[LanguageModel, float]]
                ) -> tuple[float, dict[str, float]]:
    if not folds or not values:
        raise ValueError(f"tuning needs folds and values to try; got {len(folds)} folds and values {values}")
    waveforms: list[list[torch.Tensor]] = [[read_audio(row["audio"], search.features.sample_rate) for row in fold.rows]
                                           for fold in folds]
    tried = {}
    for value in values:
        errors = words = 0
        for fold, audio in zip(folds, waveforms):
            language_model, weight = fusion(fold, value)
            hypotheses = transcribe(model, audio, tokenizer, search.features, method="beam", beam=search.beam,
                                    language_model=language_model, lm_weight=weight, ilm_weight=search.ilm_weight)
            counts = error_counts([row["text"] for row in fold.rows], hypotheses)
            errors, words = errors + counts.errors, words + counts.reference_length
        tried[str(value)] = errors / max(words, 1)
    return min(values, key=lambda v: (tried[str(v)], v)), tried


def tuned_rescoring(model: Transducer, tokenizer: TranscriptTokenizer, folds: list[TuningFold],
                    grid: list[Rescoring], lm_weight: float, penalty: float, search: BeamSearch
                    ) -> tuple[Rescoring, dict[str, float]]:
    """(the Rescoring of `grid` of the lowest WER pooled over `folds`, the lightest of equals (weight,
    then bonus, then without Whisper's transcript); {Rescoring.key: WER}). Each utterance is searched
    once (its fold's language model at lm_weight, with the lexicon penalty) and its candidates scored
    once by Whisper (with Whisper's own transcript if some setting asks for it); the grid then
    re-ranks those scores."""
    if not folds or not grid:
        raise ValueError(f"tuning needs folds and a grid to try; got {len(folds)} folds and {len(grid)} settings")
    with_transcript = any(setting.whisper_transcript for setting in grid)
    ranked = []  # per utterance: (reference, its segments' Candidates)
    for fold in folds:
        fusion = LexiconPenalty(fold.language_model, tokenizer, fold.words, penalty) if penalty else fold.language_model
        recogniser = Recogniser(model, tokenizer, search.features, fusion, lm_weight, search.ilm_weight, search.beam)
        audio = [read_audio(row["audio"], search.features.sample_rate) for row in fold.rows]
        found = segment_hypotheses(model, audio, tokenizer, search.features, search.beam, language_model=fusion,
                                   lm_weight=lm_weight, ilm_weight=search.ilm_weight)
        for row, parts in zip(fold.rows, found):
            ranked.append((row["text"], [second_pass_candidates(recogniser, segment, with_transcript) for segment in parts]))
    tried = {}
    for setting in grid:
        hypotheses = [" ".join(" ".join(best_rescored(c, setting) for c in segments).split()) for _, segments in ranked]
        tried[setting.key] = error_counts([r for r, _ in ranked], hypotheses).rate
    best = min(grid, key=lambda r: (tried[r.key], r.weight, r.token_bonus, r.whisper_transcript))
    return best, tried
