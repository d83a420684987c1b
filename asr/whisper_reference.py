"""Whisper tiny.en itself as a reader of speech: its own encoder and decoder (CTranslate2, on the
packaged model.bin the transducer's encoder is imported from; greedy, 30 s windows as Whisper reads
them), its text put in spoken form (`asr.spoken_form`) and normalised as references are. The peer
of the pretrained-encoder transducer, and a judge of how intelligible a synthetic voice is. Needs the
dev requirements ctranslate2 and transformers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from asr.spoken_form import spoken_form
from asr.text import normalize
from asr.whisper_encoder import packaged_whisper_tiny_en

SAMPLE_RATE = 16000
"""Whisper's input rate (Hz)."""
BATCH = 8
"""Waveforms decoded together."""


class WhisperReader:
    """Whisper tiny.en's greedy transcripts of 16 kHz waveforms."""

    def __init__(self, threads: int = 1) -> None:
        import ctranslate2
        import tokenizers
        from transformers import WhisperFeatureExtractor

        folder = Path(packaged_whisper_tiny_en()).parent
        self.model = ctranslate2.models.Whisper(str(folder), device="cpu", intra_threads=threads)
        self.tokenizer = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.extractor = WhisperFeatureExtractor(feature_size=80)
        self.prompt = [self.tokenizer.token_to_id("<|startoftranscript|>"), self.tokenizer.token_to_id("<|notimestamps|>")]

    def read(self, waveforms: Sequence[np.ndarray]) -> list[str]:
        """Normalised transcripts of `waveforms`, each (samples,) float in [-1, 1] at 16 kHz, <= 30 s."""
        import ctranslate2

        transcripts = []
        for start in range(0, len(waveforms), BATCH):
            batch = [np.asarray(w, dtype=np.float32) for w in waveforms[start : start + BATCH]]
            features = self.extractor(batch, sampling_rate=SAMPLE_RATE, return_tensors="np").input_features
            results = self.model.generate(ctranslate2.StorageView.from_array(np.ascontiguousarray(features)),
                                          [self.prompt] * len(batch), beam_size=1)
            transcripts += [normalize(spoken_form(self.tokenizer.decode(r.sequences_ids[0]))) for r in results]
        return transcripts
