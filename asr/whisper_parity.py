"""Parity of the imported Whisper encoder with the implementations it comes from: CTranslate2's own
encoder forward pass on the same model.bin, and transformers' WhisperFeatureExtractor for the
feature scaling. Used by tests/asr/test_whisper_encoder.py (which bounds the errors) and
benchmarks/whisper_parity.py (which prints them). Needs the dev requirements ctranslate2 and
transformers."""

from __future__ import annotations

import numpy as np
import torch

from asr.features import FeatureConfig, log_mel
from asr.whisper_encoder import WhisperEncoder, packaged_whisper_tiny_en, whisper_scaled
from zoo.parity import relative_error


def encoder_error(encoder: WhisperEncoder, frames: int) -> float:
    """Relative error of `encoder` (tiny.en, imported) against CTranslate2's float32 encoder on two
    random (frames, 80) feature sequences (seeded by `frames`)."""
    import ctranslate2

    reference = ctranslate2.models.Whisper(str(packaged_whisper_tiny_en().parent), device="cpu", compute_type="float32")
    features = torch.randn(2, frames, 80, generator=torch.Generator().manual_seed(frames)) * 0.5
    expected = np.asarray(reference.encode(ctranslate2.StorageView.from_array(features.transpose(1, 2).contiguous().numpy()),
                                           to_cpu=True))
    with torch.no_grad():
        encoded, lengths = encoder.eval()(features, torch.tensor([frames, frames]))
    if encoded.shape != expected.shape or lengths.tolist() != [frames // 2] * 2:
        raise ValueError(f"encoded {tuple(encoded.shape)} with lengths {lengths.tolist()}; CTranslate2 gave {expected.shape}")
    return relative_error(encoded, torch.from_numpy(expected))


def feature_scaling_error(seed: int = 0) -> float:
    """Relative error of `asr.features.log_mel` + `whisper_scaled` against WhisperFeatureExtractor on 3 s
    of noise with a loud stretch (which sets the maximum, and the floor 8 decades below it)."""
    from transformers import WhisperFeatureExtractor

    waveform = np.random.default_rng(seed).normal(0, 0.1, 16000 * 3).astype(np.float32)
    waveform[16000:20000] *= 30
    expected = WhisperFeatureExtractor(feature_size=80)(waveform, sampling_rate=16000, return_tensors="np",
                                                        padding="longest")["input_features"][0].T  # (T, 80)
    features, frames = log_mel(torch.from_numpy(waveform).double()[None], FeatureConfig())
    # Whisper drops the centred STFT's last frame.
    scaled = whisper_scaled(features[:, :-1].double(), frames - 1)[0]
    return relative_error(scaled, torch.from_numpy(expected))
