"""A second pass over a transducer's n-best: each hypothesis rescored by Whisper tiny.en's own
encoder and decoder (two-pass recognition, Sainath et al., 2019: a first pass whose final beam an
attention decoder rescores). Whisper runs as it was trained, on the 30 s window of the clip (its
encoder and decoder imported into torch from the packaged model.bin the transducer's encoder comes
from), and gives log P(hypothesis, end of text | audio), the hypothesis as Whisper's tokens of its
text, teacher-forced in one batched decoder pass.

    rescorer = WhisperRescorer()
    rescorer.log_probs(waveform (N,) at 16 kHz, texts) -> [(log P(text | audio), Whisper tokens)]
    reading = rescorer.read(waveform, texts of the hypotheses, transcript=True)
    candidates = reading.candidates(hypotheses [(text, first-pass score)], first_pass_score)
    best_rescored(candidates, Rescoring(weight, token_bonus, whisper_transcript)) -> text

The rescored score is first-pass score + weight x (Whisper's log probability + token_bonus x its
tokens). Whisper's own greedy transcript may join the hypotheses, scored by the first pass as they
are (for a transducer, summed over every alignment its search can take, with the language model's
terms: `asr.decoding.hypothesis_scores`):
where the first pass has never heard a voice like the clip's, Whisper's reading is often the right
one. The weight, bonus and transcript are chosen on validation (`asr.decoding_tuning.tuned_rescoring`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from asr.spoken_form import spoken_form
from asr.text import normalize
from asr.whisper_decoder import Memories, WhisperDecoder
from asr.whisper_encoder import WhisperEncoder, packaged_whisper_tiny_en

SAMPLE_RATE = 16000
"""Whisper's input rate (Hz)."""
HOP = 160
"""Samples per Whisper log-mel frame (10 ms)."""
WINDOW_FRAMES = 3000
"""Log-mel frames of Whisper's 30 s window."""
TOKENS_PER_SECOND = 10
"""Longest transcript Whisper may write, in its tokens a second of audio: twice fast speech (about
3 words a second, 1.3 tokens a word); what runs longer is a loop."""


@dataclass(frozen=True)
class Rescoring:
    """How a hypothesis's Whisper log probability joins its first-pass score."""

    weight: float = 0.0
    """Weight of Whisper's log probability (0: no second pass)."""
    token_bonus: float = 0.0
    """Added to Whisper's log probability per Whisper token of the hypothesis (its end included), so
    that a hypothesis is not preferred for having fewer factors."""
    whisper_transcript: bool = False
    """Whisper's own greedy transcript of the clip (in spoken form) joins the hypotheses, its first-pass
    score the transducer's own of it (`Candidates.transcript`)."""

    def __post_init__(self) -> None:
        if self.weight < 0:
            raise ValueError(f"Rescoring.weight must be >= 0; got {self.weight}")

    @property
    def key(self) -> str:
        """"weight,bonus", with ",transcript" when Whisper's transcript joins: how tuning reports it."""
        return f"{self.weight},{self.token_bonus}" + (",transcript" if self.whisper_transcript else "")


@dataclass(frozen=True)
class Candidates:
    """What the second pass chooses among for one clip."""

    hypotheses: list[tuple[str, float]]
    """The first pass's final hypotheses (text, score), best first."""
    scored: list[tuple[float, int]]
    """Whisper's (log probability, tokens) of each hypothesis."""
    transcript: tuple[str, float, float, int] | None = None
    """Whisper's own transcript when the hypotheses lack it: (text, the first pass's score of it,
    Whisper's log probability, tokens); None when they hold it or it was not asked for."""

    def __post_init__(self) -> None:
        if len(self.hypotheses) != len(self.scored) or not self.hypotheses:
            raise ValueError(f"Candidates need one Whisper score per hypothesis; got {len(self.hypotheses)} hypotheses "
                             f"and {len(self.scored)} scores")


@dataclass(frozen=True)
class WhisperReading:
    """What Whisper makes of one clip, whatever the rescoring's weights: its scores of texts and, when
    asked for, its own transcript; the clip's candidates for any rescoring are made from it."""

    scored: dict[str, tuple[float, int]]
    """Whisper's (log probability, tokens) of each text it read the clip against."""
    transcript: tuple[str, float, int] | None
    """Whisper's own transcript (text, log probability, tokens); None when not asked for."""

    def candidates(self, hypotheses: list[tuple[str, float]],
                   first_pass_score: Callable[[str], float] | None = None) -> Candidates:
        """The clip's final `hypotheses` [(text, score)] with their Whisper scores (each must be among
        `scored`); with `first_pass_score` (text -> the first pass's score of it), Whisper's own
        transcript too, unless the hypotheses hold it (the reading must hold the transcript)."""
        scored = [self.scored[text] for text, _ in hypotheses]
        if first_pass_score is None:
            return Candidates(hypotheses, scored)
        if self.transcript is None:
            raise ValueError("candidates with Whisper's transcript need a reading made with transcript=True")
        own, log_prob, tokens = self.transcript
        if own in (text for text, _ in hypotheses):
            return Candidates(hypotheses, scored)
        return Candidates(hypotheses, scored, (own, first_pass_score(own), log_prob, tokens))


class WhisperRescorer:
    """Whisper tiny.en's log probabilities of hypotheses given a clip: its encoder
    (`asr.whisper_encoder`) and decoder (`asr.whisper_decoder`) imported into torch from the packaged
    model.bin, its tokenizer, and transformers' feature extractor."""

    def __init__(self) -> None:
        import tokenizers
        from transformers import WhisperFeatureExtractor

        path = packaged_whisper_tiny_en()
        self.encoder = WhisperEncoder.from_ctranslate2(path).eval()
        self.decoder = WhisperDecoder.from_ctranslate2(path).eval()
        self.tokenizer = tokenizers.Tokenizer.from_file(str(path.parent / "tokenizer.json"))
        self.extractor = WhisperFeatureExtractor(feature_size=80)
        self.start = [self.tokenizer.token_to_id("<|startoftranscript|>"), self.tokenizer.token_to_id("<|notimestamps|>")]
        self.end = self.tokenizer.token_to_id("<|endoftext|>")

    def tokens(self, text: str) -> list[int]:
        """Whisper's tokens of `text` as it would write it after its start (a leading space), with
        the end of text."""
        return (self.tokenizer.encode(" " + text, add_special_tokens=False).ids if text else []) + [self.end]

    @torch.no_grad()
    def encode(self, waveform: torch.Tensor) -> torch.Tensor:
        """`waveform` (N,) float at 16 kHz, at most 30 s -> Whisper's encoding (1, 1500, W) of its 30 s
        window, zero-padded as Whisper was trained."""
        if waveform.numel() > WINDOW_FRAMES * HOP:
            raise ValueError(f"Whisper rescores clips of at most 30 s; got {waveform.numel() / SAMPLE_RATE:.1f} s")
        features = self.extractor([waveform.numpy().astype(np.float32)], sampling_rate=SAMPLE_RATE,
                                  return_tensors="pt").input_features.transpose(1, 2)  # (1, 3000, 80)
        return self.encoder(features, torch.tensor([features.shape[1]]))[0]

    @torch.no_grad()
    def memories(self, waveform: torch.Tensor) -> Memories:
        """What Whisper's decoder reads of `waveform` (N,) at 16 kHz, at most 30 s: each block's
        cross-attention keys and values (1, H, 1500, D) of its encoding (`encode`)."""
        return self.decoder.memories(self.encode(waveform))

    def log_probs(self, waveform: torch.Tensor, texts: Sequence[str]) -> list[tuple[float, int]]:
        """(log P(text, end of text | waveform), Whisper tokens with the end) of each of `texts`, given
        `waveform` (N,) float at 16 kHz, at most 30 s."""
        return self._scored(self.memories(waveform), texts)

    def _scored(self, memories: Memories, texts: Sequence[str]) -> list[tuple[float, int]]:
        tokens = [self.tokens(text) for text in texts]
        return list(zip(self.decoder.sequence_log_probs(memories, self.start, tokens), map(len, tokens)))

    def transcript(self, memories: Memories, seconds: float) -> str:
        """Whisper's greedy transcript of a clip of `seconds` from its `memories`, at most
        TOKENS_PER_SECOND tokens a second of it (Whisper may loop on a voice it cannot read), in
        spoken form and normalised as references are (`asr.spoken_form`, `asr.text.normalize`)."""
        tokens = self.decoder.greedy(memories, self.start, self.end, math.ceil(TOKENS_PER_SECOND * seconds) + 1)
        return normalize(spoken_form(self.tokenizer.decode(tokens)))

    def read(self, waveform: torch.Tensor, texts: Sequence[str], transcript: bool) -> WhisperReading:
        """Whisper's reading of `waveform` (N,) at 16 kHz, at most 30 s: each of `texts` scored, and
        with `transcript` its own transcript, scored in the same decoder pass."""
        memories = self.memories(waveform)
        texts = list(dict.fromkeys(texts))
        own = self.transcript(memories, waveform.numel() / SAMPLE_RATE) if transcript else None
        extra = [own] if own is not None and own not in texts else []
        scored = dict(zip(texts + extra, self._scored(memories, texts + extra)))
        return WhisperReading(scored, None if own is None else (own, *scored[own]))


def best_rescored(candidates: Candidates, rescoring: Rescoring) -> str:
    """The text of `candidates` (Whisper's transcript among them if it is there and rescoring asks for
    it) whose first-pass score + rescoring.weight x (Whisper's log probability + token_bonus x its
    tokens) is highest (the first of equals); weight 0 is no second pass: the first hypothesis."""
    if not rescoring.weight:
        return candidates.hypotheses[0][0]
    rows = [(text, first, log_prob, tokens)
            for (text, first), (log_prob, tokens) in zip(candidates.hypotheses, candidates.scored)]
    if rescoring.whisper_transcript and candidates.transcript is not None:
        rows.append(candidates.transcript)
    totals = [first + rescoring.weight * (log_prob + rescoring.token_bonus * tokens) for _, first, log_prob, tokens in rows]
    return rows[max(range(len(totals)), key=totals.__getitem__)][0]
