"""A tiny transducer and token utterances it can learn in seconds, shared by the decoding tests."""

from __future__ import annotations

import torch

from asr.model import Transducer, TransducerConfig
from asr.whisper_encoder import WhisperEncoderConfig

BINS = 20


def tiny(seed: int = 0, **fields) -> Transducer:
    torch.manual_seed(seed)
    defaults = dict(vocab_size=8, spec_augment=None, encoder_layers=2, encoder_input_dim=BINS, encoder_width=64,
                    encoder_dropout=0.0, decoder_dim=32, joiner_dim=32)
    return Transducer(TransducerConfig.sized("tiny", **{**defaults, **fields}))


def token_utterances(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Features in which token t (1..7) is 12 frames lighting bins 2t and 2t+1, separated by 4
    silent frames, plus noise: input_features (B, T, 20), attention_mask (B, T), labels (B, U)
    padded with -100."""
    g = torch.Generator().manual_seed(seed)
    features, labels = [], []
    for _ in range(count):
        tokens = torch.randint(1, 8, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g)
        frames = [torch.zeros(6, BINS)]
        for token in tokens.tolist():
            lit = torch.zeros(12, BINS)
            lit[:, 2 * token : 2 * token + 2] = 3.0
            frames += [lit, torch.zeros(4, BINS)]
        x = torch.cat(frames)
        features.append(x + 0.3 * torch.randn(x.shape, generator=g))
        labels.append(tokens)
    input_features = torch.zeros(count, max(f.shape[0] for f in features), BINS)
    attention_mask = torch.zeros(input_features.shape[:2], dtype=torch.long)
    padded = torch.full((count, max(t.numel() for t in labels)), -100)
    for row, (x, tokens) in enumerate(zip(features, labels)):
        input_features[row, : x.shape[0]], attention_mask[row, : x.shape[0]], padded[row, : tokens.numel()] = x, 1, tokens
    return input_features, attention_mask, padded


def tiny_whisper(seed: int = 0, **fields) -> Transducer:
    """A tiny transducer on a Whisper-style encoder (2 blocks of width 64, 64 positions = 128 frames)."""
    torch.manual_seed(seed)
    defaults = dict(vocab_size=8, spec_augment=None, decoder_dim=32, joiner_dim=32, encoder_kind="whisper",
                    encoder=WhisperEncoderConfig(input_dim=BINS, width=64, layers=2, heads=4, max_frames=64))
    return Transducer(TransducerConfig(**{**defaults, **fields}))
