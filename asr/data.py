"""Speech data: a corpus synthesised from public-domain and openly licensed sentences, the recorded
clips of Debian `pocketsphinx-testdata`, checked loading, duration buckets and batching.

`build_corpus` speaks sentences of the Shakespeare corpus (`asr.text.corpus_sentences`), or of six
modern text sources in spoken form (`asr.training_text`, CorpusConfig.text "modern"), with
espeak-ng voices (an accent with a voice variant, a speed and a pitch; modern text adds flite's
voices, Kokoro's neural voices and a held-out synthesiser, piper: `asr.voices`), resamples to 16 kHz and
caches WAV files with JSON-lines manifests in the data directory. Splits:
    train, validation      sentences of their own, training voices
    test_sentences         unseen sentences, training voices
    test_voices            the same unseen sentences, unseen speakers (voice variants never trained on,
                           in the training accents)
    test_accent            the same unseen sentences, an unseen accent (spoken by training variants)
    test_domain            modern text only: sentences of the held-out text source, unseen speakers
    test_synthesiser       modern text only: the test_domain sentences spoken by piper's neural voice
    validation_kokoro      modern text with Kokoro: the validation sentences spoken by unseen Kokoro
                           speakers (blends of three of its voices), to choose by on natural voices too
Manifests load with `datasets` (`load_manifest`); `SpeechExamples` checks every clip once when it
is built: unreadable, empty, too short or too low-rate audio and empty transcripts are skipped
with a count in the log, so training never meets them mid-epoch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import subprocess
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch

from asr.accents import SyntheticAccent, draw_accents, espeak_data
from asr.augmentation import WaveformAugment
from asr.features import FeatureConfig, log_mel, resample
from asr.model import IGNORE_INDEX
from asr.text import TranscriptTokenizer, corpus_sentences, normalize
from asr.training_text import LANGUAGE_MODEL_SOURCES, SOURCES, TextSplitConfig, source_sentences, split_by_source
from asr.voices import (ACCENTS, HELD_OUT_ACCENT, Voice, flite_voice, kokoro_blend, kokoro_voice, speak,
                        unseen_kokoro_voice, voices)
from zoo.corpora import shakespeare_text
from zoo.downloads import data_dir, debian_package, unpacked_once, write_atomically

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test_sentences", "test_voices", "test_accent")
DOMAIN_SPLIT = "test_domain"
"""Split of a "modern" corpus: sentences of the held-out text source (`asr.training_text`), unseen speakers."""
SYNTHESISER_SPLIT = "test_synthesiser"
"""Split of a "modern" corpus: the DOMAIN_SPLIT sentences spoken by the held-out synthesiser (piper)."""
KOKORO_VALIDATION_SPLIT = "validation_kokoro"
"""Split of a "modern" corpus with Kokoro (kokoro_share > 0): the validation sentences spoken by Kokoro
speakers no training clip has (`asr.voices.KOKORO_UNSEEN_BLENDS`)."""
TextKind = Literal["shakespeare", "modern"]
CORPUS_LAYOUT = 3
"""Version of the splits' definition, part of the corpus key (1: a single test_voices set mixed the
unseen accent and the unseen variants; 2: piper's clips drew unseeded noise, other on every synthesis)."""
RECORDED_PACKAGE = "pocketsphinx-testdata"
RECORDED_SETS = {"librivox": "transcription", "cards": "cards.transcription"}
MIN_SAMPLE_RATE = 8000
SAMPLE_RATE = 16000
"""Rate the corpus clips are stored at."""


@dataclass(frozen=True)
class CorpusConfig:
    """What `build_corpus` synthesises."""

    train_sentences: int = 16000
    """Training utterances (one sentence, one voice each)."""
    validation_sentences: int = 200
    """Validation utterances."""
    test_sentences: int = 200
    """Unseen sentences, each spoken three times: by a training voice, by an unseen speaker and in
    the unseen accent."""
    vocabulary_size: int = 2000
    """Sentences use only the corpus's this many most frequent words."""
    max_words: int = 10
    """Longest sentence in words (the shortest has 3)."""
    seed: int = 0
    """Seed of the sentence split and the voice draws."""
    synthetic_accents: int = 0
    """Random accents (`asr.accents`: a training accent with random phoneme replacements) that
    speak a share of the training sentences; 0: none. The other splits keep their voices."""
    synthetic_share: float = 0.5
    """Share of the training sentences the synthetic accents speak (in place of a training accent)."""
    accent_rules: int = 4
    """Phoneme replacements of each synthetic accent."""
    extra_accents: tuple[str, ...] = ()
    """espeak-ng accents besides ACCENTS (e.g. "en-us-nyc") that speak training sentences only, each
    as often as a training accent (the held-out sets keep their voices)."""
    text: TextKind = "shakespeare"
    """"shakespeare": Shakespeare sentences within vocabulary_size words; "modern": the open-vocabulary
    sentences of `asr.training_text` (seven sources in spoken form, up to max_words words), whose
    held-out source is never trained on and is spoken by unseen speakers as DOMAIN_SPLIT."""
    domain_sentences: int = 200
    """Sentences of the held-out text source in DOMAIN_SPLIT and SYNTHESISER_SPLIT (text "modern")."""
    flite_share: float = 0.2
    """Share of the training sentences flite's voices speak in place of an espeak voice (text "modern")."""
    kokoro_share: float = 0.0
    """Share of the training sentences Kokoro's neural voices speak in place of the voice drawn
    before (text "modern"; 0: none; about 0.5 s of one core per second of speech)."""
    kokoro_blend_share: float = 0.0
    """Share of Kokoro's training sentences spoken by an even blend of two of its voices
    (`asr.voices.KOKORO_BLENDS`) in place of one of them; 0: none."""

    @property
    def splits(self) -> tuple[str, ...]:
        """The corpus's splits: SPLITS, DOMAIN_SPLIT and SYNTHESISER_SPLIT for modern text, and
        KOKORO_VALIDATION_SPLIT for modern text with Kokoro."""
        modern = (DOMAIN_SPLIT, SYNTHESISER_SPLIT) if self.text == "modern" else ()
        return SPLITS + modern + ((KOKORO_VALIDATION_SPLIT,) if modern and self.kokoro_share else ())

    def __post_init__(self) -> None:
        if min(self.train_sentences, self.validation_sentences, self.test_sentences) < 1 or self.max_words < 3:
            raise ValueError(f"CorpusConfig needs at least one sentence per split and max_words >= 3; got {self}")
        if self.synthetic_accents < 0 or not 0 <= self.synthetic_share <= 1 or self.accent_rules < 1:
            raise ValueError(f"CorpusConfig needs synthetic_accents >= 0, synthetic_share in [0, 1] and accent_rules "
                             f">= 1; got {self.synthetic_accents}, {self.synthetic_share}, {self.accent_rules}")
        object.__setattr__(self, "extra_accents", tuple(self.extra_accents))  # a list from config.json
        for name in ("flite_share", "kokoro_share", "kokoro_blend_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"CorpusConfig.{name} must be in [0, 1]; got {getattr(self, name)}")
        if self.text not in get_args(TextKind) or self.domain_sentences < 1:
            raise ValueError(f"CorpusConfig needs text in {get_args(TextKind)} and domain_sentences >= 1; got "
                             f"{self.text!r} and {self.domain_sentences}")
        if set(ACCENTS) & set(self.extra_accents) or len(set(self.extra_accents)) != len(self.extra_accents):
            raise ValueError(f"CorpusConfig.extra_accents must be distinct and not among {sorted(ACCENTS)}; "
                             f"got {self.extra_accents}")

    @property
    def key(self) -> str:
        """Short hash naming the corpus folder: of the fields and CORPUS_LAYOUT (the fields of
        synthetic and extra accents, of the text and of Kokoro's shares, are left out when they hold
        their defaults, as corpora made before they existed are the same)."""
        fields = asdict(self) | {"layout": CORPUS_LAYOUT}
        if not self.synthetic_accents:
            for name in ("synthetic_accents", "synthetic_share", "accent_rules"):
                del fields[name]
        if not self.extra_accents:
            del fields["extra_accents"]
        if self.text == "shakespeare" or not self.kokoro_share:
            del fields["kokoro_share"]
        if self.text == "shakespeare" or not self.kokoro_share or not self.kokoro_blend_share:
            del fields["kokoro_blend_share"]
        if self.text == "shakespeare":
            del fields["text"], fields["domain_sentences"], fields["flite_share"]
        else:
            del fields["vocabulary_size"]
        return hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]


def split_sentences(config: CorpusConfig, rng: random.Random | None = None) -> tuple[list[str], list[str], list[str]]:
    """The (train, validation, test) sentences of the corpus `config` describes, drawn by `rng`
    (default: seeded with config.seed, as `build_corpus` draws them; it goes on to draw the voices).
    Modern text draws each split from its own sentences (`asr.training_text.split_by_source`), as
    many from each source as it has left (round robin over the shuffled sources)."""
    rng = random.Random(config.seed) if rng is None else rng
    if config.text == "modern":
        splits = _modern_splits(config)
        return tuple(_drawn(splits[name], count, name, rng) for name, count in
                     (("train", config.train_sentences), ("validation", config.validation_sentences),
                      ("test", config.test_sentences)))
    sentences = corpus_sentences(shakespeare_text(), max_words=config.max_words, vocabulary_size=config.vocabulary_size)
    rng.shuffle(sentences)
    wanted = config.test_sentences + config.validation_sentences + config.train_sentences
    if len(sentences) < wanted:
        raise ValueError(f"the corpus has {len(sentences)} sentences of at most {config.max_words} words; "
                         f"the splits want {wanted}")
    test = sentences[: config.test_sentences]
    validation = sentences[config.test_sentences : config.test_sentences + config.validation_sentences]
    return sentences[config.test_sentences + config.validation_sentences : wanted], validation, test


def training_text_sentences(config: CorpusConfig, without: str | None = None) -> list[str]:
    """Every training-split sentence of modern text (`asr.training_text`, up to config.max_words words),
    less source `without`'s: the text a tokenizer or language model may learn from beside the spoken
    training sentences, which are drawn from it; no validation, test or held-out-domain sentence is
    among them."""
    if config.text != "modern":
        raise ValueError(f"training text sentences exist for text 'modern'; the corpus has text {config.text!r}")
    if without is not None and without not in SOURCES:
        raise ValueError(f"training_text_sentences without must be a training source {SOURCES}; got {without!r}")
    return [sentence for source, sentence in _modern_splits(config)["train"] if source != without]


def sentence_sources(config: CorpusConfig, split: str) -> dict[str, str]:
    """{sentence: its text source} of `split` ("train", "validation", "test" or "test_domain") of
    modern text: which source a spoken sentence of that split came from."""
    if config.text != "modern":
        raise ValueError(f"sentence sources exist for text 'modern'; the corpus has text {config.text!r}")
    splits = _modern_splits(config)
    if split not in splits:
        raise ValueError(f"sentence_sources split must be one of {sorted(splits)}; got {split!r}")
    return {sentence: source for source, sentence in splits[split]}


def language_model_sentences(config: CorpusConfig, sources: tuple[str, ...]) -> list[str]:
    """The sentences of `sources` (each in `asr.training_text.LANGUAGE_MODEL_SOURCES`) of as many words
    as the training text's (`TextSplitConfig`'s min_words to config.max_words) that no validation, test
    or held-out-domain sentence equals: text a language model may read beside `training_text_sentences`,
    which no tokenizer learns from."""
    unknown = sorted(set(sources) - set(LANGUAGE_MODEL_SOURCES))
    if unknown:
        raise ValueError(f"language-model sources must be among {LANGUAGE_MODEL_SOURCES}; got {unknown}")
    splits = _modern_splits(config)
    held_out = {sentence for name in ("validation", "test", "test_domain") for _, sentence in splits[name]}
    limits = TextSplitConfig(max_words=config.max_words)
    return [sentence for source in sources for sentence in source_sentences(source)
            if limits.min_words <= len(sentence.split()) <= limits.max_words and sentence not in held_out]


def domain_sentences(config: CorpusConfig, rng: random.Random) -> list[str]:
    """config.domain_sentences sentences of the held-out text source, drawn by `rng`."""
    return _drawn(_modern_splits(config)["test_domain"], config.domain_sentences, "test_domain", rng)


def _modern_splits(config: CorpusConfig) -> dict[str, list[tuple[str, str]]]:
    """{split: [(source, sentence)]} of `asr.training_text`, up to config.max_words words."""
    sources = {source: source_sentences(source) for source in SOURCES}
    return split_by_source(sources, TextSplitConfig(max_words=config.max_words))


def _drawn(rows: list[tuple[str, str]], count: int, name: str, rng: random.Random) -> list[str]:
    """`count` sentences of rows (source, sentence): each source's shuffled, then taken in turn from
    every source that has some left, so that small sources give all they have and large ones the rest."""
    if len(rows) < count:
        raise ValueError(f"the {name} text has {len(rows)} sentences; the corpus wants {count}")
    by_source: dict[str, list[str]] = {}
    for source, sentence in rows:
        by_source.setdefault(source, []).append(sentence)
    queues = [rng.sample(sentences, len(sentences)) for _, sentences in sorted(by_source.items())]
    drawn = []
    while len(drawn) < count:
        for queue in queues:
            if queue and len(drawn) < count:
                drawn.append(queue.pop())
    return drawn


def corpus_plan(config: CorpusConfig) -> tuple[dict[str, list[tuple[str, Voice]]], list[SyntheticAccent]]:
    """({split: [(sentence, voice)]}, the synthetic accents) of the corpus `config` describes. The
    extra and the synthetic accents, then flite's and then Kokoro's voices, then blends of Kokoro's
    (modern text; each drawn by its own generator) take over a share of the training voices, so
    that every other draw is the same with them or without."""
    rng = random.Random(config.seed)
    train, validation, test = split_sentences(config, rng)
    plan = {"train": list(zip(train, voices("none", len(train), rng))),
            "validation": list(zip(validation, voices("none", len(validation), rng))),
            "test_sentences": list(zip(test, voices("none", len(test), rng))),
            "test_voices": list(zip(test, voices("variants", len(test), rng))),
            "test_accent": list(zip(test, voices("accent", len(test), rng)))}
    if config.text == "modern":
        domain = domain_sentences(config, rng)
        plan[DOMAIN_SPLIT] = list(zip(domain, voices("variants", len(domain), rng)))
        plan[SYNTHESISER_SPLIT] = list(zip(domain, voices("synthesiser", len(domain), rng)))
    accent_rng = random.Random(f"{config.seed}-accents")
    bases = tuple(a for a in ACCENTS if a != HELD_OUT_ACCENT)
    if config.extra_accents:
        share = len(config.extra_accents) / (len(bases) + len(config.extra_accents))
        plan["train"] = [(text, replace(voice, accent=accent_rng.choice(config.extra_accents))
                          if accent_rng.random() < share else voice) for text, voice in plan["train"]]
    accents = draw_accents(config.synthetic_accents, config.accent_rules, bases, accent_rng)
    if accents:
        plan["train"] = [(text, replace(voice, accent=accent_rng.choice(accents).name)
                          if accent_rng.random() < config.synthetic_share else voice) for text, voice in plan["train"]]
    if config.text == "modern" and config.flite_share:
        flite_rng = random.Random(f"{config.seed}-flite")
        plan["train"] = [(text, flite_voice(flite_rng) if flite_rng.random() < config.flite_share else voice)
                         for text, voice in plan["train"]]
    if config.text == "modern" and config.kokoro_share:
        kokoro_rng = random.Random(f"{config.seed}-kokoro")
        plan["train"] = [(text, kokoro_voice(kokoro_rng) if kokoro_rng.random() < config.kokoro_share else voice)
                         for text, voice in plan["train"]]
    if config.text == "modern" and config.kokoro_share and config.kokoro_blend_share:
        blend_rng = random.Random(f"{config.seed}-kokoro-blend")
        plan["train"] = [(text, kokoro_blend(blend_rng) if voice.synthesiser == "kokoro"
                          and blend_rng.random() < config.kokoro_blend_share else voice) for text, voice in plan["train"]]
    if KOKORO_VALIDATION_SPLIT in config.splits:
        unseen_rng = random.Random(f"{config.seed}-kokoro-validation")
        plan[KOKORO_VALIDATION_SPLIT] = [(text, unseen_kokoro_voice(unseen_rng)) for text in validation]
    return plan, accents


def build_corpus(config: CorpusConfig = CorpusConfig(), root: Path | None = None, workers: int = 4,
                 splits: tuple[str, ...] | None = None) -> Path:
    """Synthesise (once) the corpus `config` describes, or only its `splits` (default: all of
    config.splits; an evaluation needs no training speech); returns its folder, which holds wav/ and
    one manifest per split, SPLIT.jsonl: {"audio", "text", "voice", "speed", "pitch", "seconds"}.
    A split's clips do not depend on which other splits are built."""
    splits = config.splits if splits is None else tuple(splits)
    unknown = sorted(set(splits) - set(config.splits))
    if unknown:
        raise ValueError(f"build_corpus splits must be among {config.splits}; got {unknown}")
    folder = (data_dir() if root is None else root) / f"espeak_corpus_{config.key}"
    missing = [split for split in splits if not (folder / f"{split}.jsonl").exists()]
    if not missing:
        return folder
    (folder / "wav").mkdir(parents=True, exist_ok=True)
    plan, accents = corpus_plan(config)
    plan = {split: plan[split] for split in missing}
    espeak_path = espeak_data(accents, folder / "espeak") if accents else None

    def render(job: tuple[str, int, str, Voice]) -> dict[str, Any]:
        split, index, text, voice = job
        path = folder / "wav" / f"{split}_{index:06d}.wav"
        # A clip left by an interrupted build is kept; its length is read back.
        seconds = (read_audio(path, SAMPLE_RATE).numel() / SAMPLE_RATE if path.exists()
                   else speak(text, voice, path, espeak_path=espeak_path))
        return {"audio": str(path), "text": text, "voice": voice.name, "speed": voice.speed, "pitch": voice.pitch,
                "seconds": round(seconds, 3)}

    log.info("synthesising the speech corpus %s: %d clips (once; later runs reuse it)", folder,
             sum(len(items) for items in plan.values()))
    with ThreadPoolExecutor(workers) as pool:
        for split, items in plan.items():
            rows = list(pool.map(render, [(split, i, text, voice) for i, (text, voice) in enumerate(items)]))
            write_atomically(folder / f"{split}.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
            log.info("%s: %d clips, %.0f s of speech", split, len(rows), sum(row["seconds"] for row in rows))
    return folder


def recorded_speech(root: Path | None = None) -> list[dict[str, Any]]:
    """The transcribed recordings of Debian `pocketsphinx-testdata`: 5 LibriVox sentences (Sense
    and Sensibility) and 5 spoken card names, 16 kHz: [{"audio", "text", "set"}]."""
    root = data_dir() if root is None else root
    folder = unpacked_once(root / "pocketsphinx", lambda private: subprocess.run(
        ["dpkg-deb", "-x", str(debian_package(RECORDED_PACKAGE, root)), str(private)], check=True))
    base = folder / "usr/share/pocketsphinx/test/data"
    rows = []
    for name, listing in RECORDED_SETS.items():
        for line in (base / name / listing).read_text().splitlines():
            if not line.strip():
                continue
            text, utterance = line.rsplit("(", 1)
            stem = utterance.strip(") ")
            rows.append({"audio": str(base / name / f"{stem}.wav"), "text": normalize(text.replace("<s>", " ").replace("</s>", " ")),
                         "set": name})
    return rows


def load_manifest(path: str | Path):
    """A JSON-lines manifest as a `datasets.Dataset` (read from the local file)."""
    from datasets import load_dataset

    return load_dataset("json", data_files=str(path), split="train")


class AudioError(ValueError):
    """An audio file that cannot serve; `reason` names the kind of fault."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def pcm_to_float(samples: torch.Tensor) -> torch.Tensor:
    """Integer PCM samples (int8/16/32/64 full scale, or uint8 offset by 128) -> float64 in [-1, 1);
    floating samples are returned in float64 as they are."""
    if samples.is_floating_point():
        return samples.double()
    if samples.dtype == torch.bool or samples.is_complex():
        raise TypeError(f"audio samples must be integer PCM or floating point; got {samples.dtype}")
    if samples.dtype == torch.uint8:
        return samples.double() / 128.0 - 1.0
    return samples.double() / float(2 ** (8 * samples.element_size() - 1))


def read_audio(path: str | Path, sample_rate: int) -> torch.Tensor:
    """A WAV file -> (N,) float32 in [-1, 1) at `sample_rate` (mono: channels averaged; other
    rates of at least 8 kHz resampled). AudioError naming the file for anything unusable."""
    from scipy.io import wavfile

    try:
        rate, samples = wavfile.read(path)
    except (OSError, ValueError) as error:
        raise AudioError("unreadable audio", f"unreadable audio {str(path)!r}: {error}") from error
    waveform = pcm_to_float(torch.from_numpy(samples))
    if waveform.ndim == 2:
        waveform = waveform.mean(1)
    if waveform.numel() == 0:
        raise AudioError("empty audio", f"empty audio {str(path)!r}")
    if rate < MIN_SAMPLE_RATE:
        raise AudioError(f"sample rate below {MIN_SAMPLE_RATE} Hz",
                         f"audio {str(path)!r} has sample rate {rate} Hz; expected at least {MIN_SAMPLE_RATE} Hz")
    return resample(waveform, rate, sample_rate).float()


def read_audio_pieces(path: str | Path, sample_rate: int, samples: int) -> Iterator[torch.Tensor]:
    """A WAV file as consecutive (samples,) float32 pieces (the last shorter), as `read_audio`
    reads it whole. A file at `sample_rate` is memory-mapped and each piece read from the disk as
    it is reached; another rate is read whole and resampled first (a filter over the whole signal),
    as is 24-bit PCM, which scipy does not map. AudioError as `read_audio`."""
    from scipy.io import wavfile

    try:
        rate, mapped = wavfile.read(path, mmap=True)
    except (OSError, ValueError):  # 24-bit PCM, or unreadable: read_audio names the problem
        rate, mapped = None, None
    if mapped is None or rate != sample_rate or len(mapped) == 0:
        yield from read_audio(path, sample_rate).split(samples)
        return
    for start in range(0, len(mapped), samples):
        piece = pcm_to_float(torch.from_numpy(np.array(mapped[start:start + samples])))
        yield (piece.mean(1) if piece.ndim == 2 else piece).float()


class SpeechExamples(torch.utils.data.Dataset):
    """Checked utterances as examples {"input_features" (T, F) log-mel, "labels" (U,) token ids}.

    Built from rows {"audio", "text"}; every clip is read once here, and one that cannot serve
    (unreadable, empty, shorter than min_seconds, below 8 kHz, or an empty transcript) is
    skipped and counted (`skipped`, and a log warning). `augment` changes each waveform as it is
    read (`asr.augmentation`; training sets), before it is levelled and its features taken."""

    def __init__(self, rows, tokenizer: TranscriptTokenizer, features: FeatureConfig = FeatureConfig(),
                 min_seconds: float = 0.3, augment: WaveformAugment | None = None) -> None:
        self.tokenizer, self.features = tokenizer, features
        self.augment = augment if augment is not None and augment.active else None
        self.rows, self.seconds, self.skipped = [], [], Counter()
        for row in rows:
            text = normalize(row["text"])
            if not text:
                self.skipped["empty transcript"] += 1
                continue
            try:
                waveform = read_audio(row["audio"], features.sample_rate)
            except AudioError as error:
                self.skipped[error.reason] += 1
                continue
            if waveform.numel() < min_seconds * features.sample_rate:
                self.skipped[f"shorter than {min_seconds} s"] += 1
                continue
            self.rows.append({"audio": row["audio"], "text": text})
            self.seconds.append(waveform.numel() / features.sample_rate)
        if self.skipped:
            log.warning("skipped %d of %d utterances: %s", sum(self.skipped.values()),
                        len(self.rows) + sum(self.skipped.values()), dict(self.skipped))

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        row = self.rows[index]
        waveform = read_audio(row["audio"], self.features.sample_rate)
        if self.augment is not None:
            waveform = self.augment(waveform, self.features.sample_rate)
        waveform = self.features.levelled(waveform)
        features, _ = log_mel(waveform, self.features)
        return {"input_features": features[0], "labels": torch.tensor(self.tokenizer.encode(row["text"]))}


class DurationBuckets(torch.utils.data.Dataset):
    """Groups of `size` utterances of similar duration, each group one example (a list), so that a
    batch pads little: utterances sorted by duration (ties broken by a seeded shuffle), cut into
    consecutive groups; the last, partial group is dropped."""

    def __init__(self, examples: SpeechExamples, size: int, seed: int = 0) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1; got {size}")
        order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(seed)).tolist()
        order.sort(key=lambda i: examples.seconds[i])
        self.examples, self.groups = examples, [order[i : i + size] for i in range(0, len(order) - size + 1, size)]

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, index: int) -> list[dict[str, torch.Tensor]]:
        return [self.examples[i] for i in self.groups[index]]


def collate_speech(examples: list) -> dict[str, torch.Tensor]:
    """Examples (or lists of them, from DurationBuckets) -> {"input_features" (B, T, F) zero-padded,
    "attention_mask" (B, T) 1 = frame, "labels" (B, U) padded with -100}; examples of encoder outputs
    (`asr.encoder_cache`) give "encoder_outputs" (B, T', E) in place of "input_features"."""
    flat = [e for item in examples for e in (item if isinstance(item, list) else [item])]
    key = "input_features" if "input_features" in flat[0] else "encoder_outputs"
    frames = max(e[key].shape[0] for e in flat)
    symbols = max(e["labels"].numel() for e in flat)
    features = torch.zeros(len(flat), frames, flat[0][key].shape[1])
    mask = torch.zeros(len(flat), frames, dtype=torch.long)
    labels = torch.full((len(flat), symbols), IGNORE_INDEX, dtype=torch.long)
    for row, example in enumerate(flat):
        length = example[key].shape[0]
        features[row, :length], mask[row, :length] = example[key], 1
        labels[row, : example["labels"].numel()] = example["labels"]
    return {key: features, "attention_mask": mask, "labels": labels}
