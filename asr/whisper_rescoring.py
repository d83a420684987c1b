"""A second pass over a transducer's n-best: each hypothesis rescored by Whisper tiny.en's own
encoder and decoder (two-pass recognition, Sainath et al., 2019: a first pass whose final beam an
attention decoder rescores). Whisper runs as it was trained, on the 30 s window of the clip (its
encoder and decoder imported into torch from the packaged model.bin the transducer's encoder comes
from), and gives log P(hypothesis, end of text | audio), the hypothesis as Whisper's tokens of its
text, teacher-forced in one batched decoder pass.

    rescorer = WhisperRescorer()
    rescorer.log_probs(waveform (N,) at 16 kHz, texts) -> [(log P(text | audio), Whisper tokens)]
    best_rescored(hypotheses [(text, first-pass score)], scored, Rescoring(weight, token_bonus)) -> text

The rescored score is first-pass score + weight x (Whisper's log probability + token_bonus x its
tokens); the weight and bonus are chosen on validation (`asr.decoding_tuning.tuned_rescoring`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from asr.whisper_decoder import WhisperDecoder
from asr.whisper_encoder import WhisperEncoder, packaged_whisper_tiny_en

SAMPLE_RATE = 16000
"""Whisper's input rate (Hz)."""
HOP = 160
"""Samples per Whisper log-mel frame (10 ms)."""
WINDOW_FRAMES = 3000
"""Log-mel frames of Whisper's 30 s window."""


@dataclass(frozen=True)
class Rescoring:
    """How a hypothesis's Whisper log probability joins its first-pass score."""

    weight: float = 0.0
    """Weight of Whisper's log probability (0: no second pass)."""
    token_bonus: float = 0.0
    """Added to Whisper's log probability per Whisper token of the hypothesis (its end included), so
    that a hypothesis is not preferred for having fewer factors."""

    def __post_init__(self) -> None:
        if self.weight < 0:
            raise ValueError(f"Rescoring.weight must be >= 0; got {self.weight}")


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

    def log_probs(self, waveform: torch.Tensor, texts: Sequence[str]) -> list[tuple[float, int]]:
        """(log P(text, end of text | waveform), Whisper tokens with the end) of each of `texts`, given
        `waveform` (N,) float at 16 kHz, at most 30 s."""
        encoded = self.encode(waveform)
        if not texts:
            return []
        tokens = [self.tokens(text) for text in texts]
        return list(zip(self.decoder.sequence_log_probs(encoded, self.start, tokens), map(len, tokens)))


def best_rescored(hypotheses: Sequence[tuple[str, float]], scored: Sequence[tuple[float, int]],
                  rescoring: Rescoring) -> str:
    """The text of `hypotheses` [(text, first-pass score)] whose first-pass score + rescoring.weight x
    (Whisper's log probability + token_bonus x its tokens), `scored` [(log prob, tokens)] in the same
    order, is highest (the first of equals)."""
    if len(hypotheses) != len(scored) or not hypotheses:
        raise ValueError(f"best_rescored needs one Whisper score per hypothesis; got {len(hypotheses)} hypotheses "
                         f"and {len(scored)} scores")
    totals = [first + rescoring.weight * (log_prob + rescoring.token_bonus * tokens)
              for (_, first), (log_prob, tokens) in zip(hypotheses, scored)]
    return hypotheses[max(range(len(totals)), key=totals.__getitem__)][0]
