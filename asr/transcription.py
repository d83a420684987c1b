"""Transcription with a trained transducer: waveforms or WAV files in, text out.

    asr.transcribe("asr-transducer-tiny", ["a.wav", "b.wav"])     a zoo model: its tokenizer, front end and
                                                                   language model come along
    asr.transcribe(model, waveforms, tokenizer)                    a Transducer, (N,) tensors at 16 kHz
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cache
from collections.abc import Sequence
from typing import Literal

import torch

from asr.data import pcm_to_float, read_audio
from asr.decoding import beam_search_hypotheses, greedy_search, hypothesis_scores
from asr.features import FeatureConfig, log_mel, resample
from asr.language_model import LanguageModel
from asr.lexicon import LexiconPenalty, read_lexicon
from asr.model import Transducer
from asr.segmentation import segment_bounds
from asr.text import TranscriptTokenizer
from asr.whisper_rescoring import (SAMPLE_RATE as WHISPER_RATE, Candidates, Rescoring, WhisperReading, WhisperRescorer,
                                  best_rescored)
from asr.word_language_model import load_language_model
from zoo.store import load, locate, read_config


LANGUAGE_MODEL_FILE = "language_model.safetensors"
"""A speech recogniser's folder may hold a language model for shallow fusion (a token n-gram model,
or a word n-gram model with its lexicon); its config.json then gives {"decoding": {"lm_weight": ...}}."""
LEXICON_FILE = "lexicon.txt"
"""Beside a language model, a soft lexicon (`asr.lexicon`, one word a line): with {"decoding":
{"lexicon_penalty": p}} (p > 0), a word beam search finishes outside it costs lm_weight x p."""
DEFAULT_BEAM = 4
"""Beam of the beam search for a model whose config.json names none ({"decoding": {"beam": ...}})."""
MAX_SEGMENT_SECONDS = 20.0
"""Recordings longer than this are cut at their quietest moments (`asr.segmentation`) and transcribed
segment by segment: memory follows the segment, and a Whisper encoder takes at most 30 s."""
MAX_SYMBOLS_PER_FRAME = 3
"""Tokens a search may emit at one encoder frame, by default."""
MIN_SEGMENT_SECONDS = 0.1
"""Shorter recordings hold no word: they transcribe to "" (the encoders need a few frames), as do
silent ones (`asr.segmentation`)."""


@dataclass
class Recogniser:
    """A zoo speech recogniser: the transducer and what decoding needs beside it."""

    model: Transducer
    tokenizer: TranscriptTokenizer
    features: FeatureConfig
    language_model: LanguageModel | None
    """Fused into beam search (None: the folder has none); with the folder's lexicon penalty in it."""
    lm_weight: float
    """Its weight in the fusion."""
    ilm_weight: float
    """Weight of the internal language model subtracted in the fusion (`modified_beam_search`)."""
    beam: int
    """Beam of the beam search the model was evaluated with."""
    rescoring: Rescoring = Rescoring()
    """Second pass over the beam's n-best by Whisper tiny.en (`asr.whisper_rescoring`; weight 0: none)."""


def recogniser(name: str | os.PathLike) -> Recogniser:
    """The zoo model `name` (a name or folder) with the tokenizer, front end and language model its folder holds."""
    config = read_config(name)
    if config.get("arch") != "transducer" or "tokenizer" not in config or "features" not in config:
        raise ValueError(f"model {str(name)!r} is not a speech recogniser: expected a transducer with "
                         f"'tokenizer' and 'features' in its config.json")
    folder, decoding = locate(name), config.get("decoding", {})
    tokenizer = TranscriptTokenizer.from_spec(config["tokenizer"])
    language_model = load_language_model(folder / LANGUAGE_MODEL_FILE) if (folder / LANGUAGE_MODEL_FILE).exists() else None
    penalty = float(decoding.get("lexicon_penalty", 0.0))
    if language_model is not None and penalty > 0:
        language_model = LexiconPenalty(language_model, tokenizer, read_lexicon(folder / LEXICON_FILE), penalty)
    return Recogniser(load(name), tokenizer, FeatureConfig(**config["features"]), language_model,
                      float(decoding.get("lm_weight", 0.0)), float(decoding.get("ilm_weight", 0.0)),
                      int(decoding.get("beam", DEFAULT_BEAM)), model_rescoring(config))


def model_rescoring(config: dict) -> Rescoring:
    """The second pass a recogniser's config.json asks for ({"decoding": {"rescoring": {...}}}; none: off)."""
    return Rescoring(**config.get("decoding", {}).get("rescoring", {}))


@dataclass
class SearchedSegment:
    """A segment of a recording after the first pass: what the second pass reads."""

    waveform: torch.Tensor
    """(N,) the levelled segment at the front end's rate."""
    hypotheses: list[tuple[str, float]]
    """The beam's final hypotheses (text, score), best first (`asr.decoding.beam_search_hypotheses`)."""
    encoded: torch.Tensor
    """(T', E) the transducer's encoder output of it, kept to score hypotheses from elsewhere
    (Whisper's transcript) as the beam scores its own: T' x E floats, about a waveform's bytes."""
    whisper: WhisperReading | None = field(default=None, repr=False, compare=False)
    """Whisper's reading of it once a second pass asked for one (`second_pass_candidates`), kept so
    that every rescoring of this first pass reads the segment with Whisper once."""


@cache
def whisper_rescorer() -> WhisperRescorer:
    """The process's Whisper tiny.en rescorer, loaded on first use."""
    return WhisperRescorer()


def prepare_waveforms(waveforms: Sequence[torch.Tensor | str | os.PathLike], rate: int,
                      tensor_rate: int) -> list[torch.Tensor]:
    """(N,) float32 waveforms at `rate` Hz from WAV files and from tensors at `tensor_rate` Hz
    (see `transcribe`); TypeError or ValueError naming the bad item."""
    if isinstance(waveforms, torch.Tensor):
        raise TypeError("waveforms must be a list of WAV files or (N,) tensors; got one tensor: pass [waveform]")
    if isinstance(waveforms, (str, os.PathLike)):
        raise TypeError(f"waveforms must be a list of WAV files or (N,) tensors; got the single path "
                        f"{str(waveforms)!r}: pass [{str(waveforms)!r}]")
    prepared = []
    for index, item in enumerate(waveforms):
        if not isinstance(item, torch.Tensor):
            prepared.append(read_audio(item, rate))
            continue
        if item.ndim != 1 or item.numel() == 0:
            raise ValueError(f"waveforms[{index}] must be a non-empty (N,) tensor; got shape {tuple(item.shape)}")
        prepared.append(resample(pcm_to_float(item.detach().cpu()), tensor_rate, rate).float())
    return prepared


@torch.no_grad()
def transcribe(model: Transducer | str | os.PathLike, waveforms: Sequence[torch.Tensor | str | os.PathLike],
               tokenizer: TranscriptTokenizer | None = None, features: FeatureConfig | None = None,
               method: Literal["greedy", "beam"] = "beam", beam: int | None = None,
               max_symbols_per_frame: int = MAX_SYMBOLS_PER_FRAME,
               batch_size: int = 16, language_model: LanguageModel | None = None,
               lm_weight: float | None = None, ilm_weight: float | None = None,
               sample_rate: int | None = None, max_segment_seconds: float = MAX_SEGMENT_SECONDS,
               rescoring: Rescoring | None = None) -> list[str]:
    """One transcript per waveform, decoded by modified beam search (or greedy search) with at most
    `max_symbols_per_frame` tokens per encoder frame, `batch_size` segments at a time; a waveform
    longer than max_segment_seconds is cut into segments (`asr.segmentation`) whose transcripts are joined.

    model: a `Transducer` (then `tokenizer` is needed; `features` defaults to FeatureConfig()) or
    a zoo name/folder. waveforms: a list of WAV files (any rate of at least 8 kHz, resampled) or of
    (N,) tensors: float in [-1, 1] or integer PCM (int16 and the like, scaled from full scale), at
    `sample_rate` Hz (default: the front end's, 16 kHz), resampled when it differs.
    beam: a zoo model's own by default, else DEFAULT_BEAM.
    language_model, lm_weight, ilm_weight: shallow fusion in beam search, less the internal language
    model (`modified_beam_search`); a zoo model brings its own (lm_weight=0 turns it off).
    rescoring: a second pass of Whisper tiny.en over each segment's final beam (`asr.whisper_rescoring`);
    a zoo model brings its own (Rescoring() turns it off)."""
    if method not in ("greedy", "beam"):
        raise ValueError(f"method must be 'greedy' or 'beam'; got {method!r}")
    if not isinstance(model, Transducer):
        found = recogniser(model)
        model, tokenizer, features = found.model, found.tokenizer, found.features
        language_model = language_model or found.language_model
        lm_weight = found.lm_weight if lm_weight is None else lm_weight
        ilm_weight = found.ilm_weight if ilm_weight is None else ilm_weight
        beam = found.beam if beam is None else beam
        rescoring = found.rescoring if rescoring is None else rescoring
    elif language_model is not None and lm_weight is None:
        raise ValueError("a language_model needs its lm_weight")
    elif tokenizer is None:
        raise ValueError("a Transducer needs its tokenizer (or pass a zoo model name, which brings its own)")
    features = FeatureConfig() if features is None else features
    beam = DEFAULT_BEAM if beam is None else beam
    if rescoring is not None and rescoring.weight and features.sample_rate != WHISPER_RATE:
        raise ValueError(f"Whisper rescoring reads {WHISPER_RATE} Hz audio; the model's front end reads "
                         f"{features.sample_rate} Hz")
    waveforms = prepare_waveforms(waveforms, features.sample_rate, sample_rate or features.sample_rate)
    if method == "beam":
        found_segments = segment_hypotheses(model, waveforms, tokenizer, features, beam, max_symbols_per_frame, batch_size,
                                            language_model, lm_weight or 0.0, ilm_weight or 0.0, max_segment_seconds)
        search = Recogniser(model, tokenizer, features, language_model, lm_weight or 0.0, ilm_weight or 0.0, beam,
                            rescoring or Rescoring())
        return searched_transcripts(search, found_segments, max_symbols_per_frame)
    segments, owners = _segments(waveforms, features, max_segment_seconds)
    model.eval()
    texts = []
    for start in range(0, len(segments), batch_size):
        encoded, encoded_lengths = _encoded(model, segments[start : start + batch_size], features)
        texts += [tokenizer.decode(ids) for ids in greedy_search(model, encoded, encoded_lengths, max_symbols_per_frame)]
    joined = [[] for _ in waveforms]
    for owner, text in zip(owners, texts):
        if text:
            joined[owner].append(text)
    return [" ".join(" ".join(parts).split()) for parts in joined]


@torch.no_grad()
def segment_hypotheses(model: Transducer, waveforms: list[torch.Tensor], tokenizer: TranscriptTokenizer,
                       features: FeatureConfig, beam: int, max_symbols_per_frame: int = MAX_SYMBOLS_PER_FRAME,
                       batch_size: int = 16,
                       language_model: LanguageModel | None = None, lm_weight: float = 0.0, ilm_weight: float = 0.0,
                       max_segment_seconds: float = MAX_SEGMENT_SECONDS) -> list[list[SearchedSegment]]:
    """Per waveform (N,) at features.sample_rate, its segments (as `transcribe` cuts them) after the
    beam search."""
    segments, owners = _segments(waveforms, features, max_segment_seconds)
    model.eval()
    found: list[list[SearchedSegment]] = [[] for _ in waveforms]
    for start in range(0, len(segments), batch_size):
        chunk = segments[start : start + batch_size]
        encoded, encoded_lengths = _encoded(model, chunk, features)
        finals = beam_search_hypotheses(model, encoded, encoded_lengths, beam, max_symbols_per_frame, language_model,
                                        lm_weight, ilm_weight)
        for row, (owner, segment, hypotheses) in enumerate(zip(owners[start : start + batch_size], chunk, finals)):
            found[owner].append(SearchedSegment(segment, [(tokenizer.decode(ids), score) for ids, score in hypotheses],
                                                encoded[row, : int(encoded_lengths[row])].clone()))
    return found


def _segments(waveforms: list[torch.Tensor], features: FeatureConfig, max_segment_seconds: float
              ) -> tuple[list[torch.Tensor], list[int]]:
    """(the levelled segments (N,) of every waveform long enough to hold a word, the index of each one's waveform)."""
    segments, owners = [], []
    for index, waveform in enumerate(waveforms):
        if waveform.numel() < MIN_SEGMENT_SECONDS * features.sample_rate:
            continue
        for start, end in segment_bounds(waveform, features.sample_rate, max_segment_seconds):
            segments.append(features.levelled(waveform[start:end]))
            owners.append(index)
    return segments, owners


def _encoded(model: Transducer, chunk: list[torch.Tensor], features: FeatureConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The encoder's output (B, T', E) and lengths (B,) of the segments `chunk`, zero-padded into one batch."""
    lengths = torch.tensor([w.numel() for w in chunk])
    padded = torch.zeros(len(chunk), int(lengths.max()))
    for row, waveform in enumerate(chunk):
        padded[row, : waveform.numel()] = waveform
    log_mels, frames = log_mel(padded, features, lengths)
    mask = (torch.arange(log_mels.shape[1])[None, :] < frames[:, None]).long()
    device = model.feature_mean.device
    return model.encode(log_mels.to(device), mask.to(device))


def searched_transcripts(search: Recogniser, found: list[list[SearchedSegment]],
                         max_symbols_per_frame: int = MAX_SYMBOLS_PER_FRAME) -> list[str]:
    """One transcript per waveform from its segments after the first pass (`segment_hypotheses`):
    each segment's `chosen_text` under `search`'s rescoring, joined. The second pass alone, so that
    several rescorings share one first pass (and Whisper's reading of each segment)."""
    return [" ".join(" ".join(chosen_text(search, segment, max_symbols_per_frame) for segment in parts).split())
            for parts in found]


def chosen_text(search: Recogniser, segment: SearchedSegment, max_symbols_per_frame: int = MAX_SYMBOLS_PER_FRAME) -> str:
    """The text of a `segment` searched with at most max_symbols_per_frame tokens a frame: its best
    hypothesis, or with search.rescoring's weight the best after Whisper's second pass."""
    rescoring, hypotheses = search.rescoring, segment.hypotheses
    if not rescoring.weight or (len(hypotheses) == 1 and not rescoring.whisper_transcript):
        return hypotheses[0][0]
    return best_rescored(second_pass_candidates(search, segment, rescoring.whisper_transcript, max_symbols_per_frame),
                         rescoring)


def second_pass_candidates(search: Recogniser, segment: SearchedSegment, whisper_transcript: bool,
                           max_symbols_per_frame: int = MAX_SYMBOLS_PER_FRAME) -> Candidates:
    """A `segment`'s hypotheses scored by Whisper, with Whisper's own transcript if
    `whisper_transcript` (its first-pass score the sum over the search's alignments of it with the
    search's language-model terms, `asr.decoding.hypothesis_scores`). Whisper reads the segment once
    (`SearchedSegment.whisper`; again only to add its transcript to a reading made without)."""

    def first_pass_score(text: str) -> float:
        return hypothesis_scores(search.model, segment.encoded, [search.tokenizer.encode(text)], max_symbols_per_frame,
                                 search.language_model, search.lm_weight, search.ilm_weight)[0]

    if segment.whisper is None or (whisper_transcript and segment.whisper.transcript is None):
        segment.whisper = whisper_rescorer().read(segment.waveform, [text for text, _ in segment.hypotheses],
                                                  whisper_transcript)
    return segment.whisper.candidates(segment.hypotheses, first_pass_score if whisper_transcript else None)
