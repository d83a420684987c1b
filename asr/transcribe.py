"""Transcription with a trained transducer: waveforms or WAV files in, text out.

    asr.transcribe(model, waveforms, tokenizer)         waveforms: (N,) tensors at 16 kHz
    transcribe_files("asr-transducer-tiny", paths)      a zoo model with its tokenizer and front end
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal

import torch

from asr.data import read_audio
from asr.decoding import greedy_search, modified_beam_search
from asr.features import FeatureConfig, log_mel
from asr.model import Transducer
from asr.text import TranscriptTokenizer
from zoo.store import load, read_config


@torch.no_grad()
def transcribe(model: Transducer, waveforms: Sequence[torch.Tensor], tokenizer: TranscriptTokenizer,
               features: FeatureConfig = FeatureConfig(), method: Literal["greedy", "beam"] = "beam", beam: int = 4,
               batch_size: int = 16) -> list[str]:
    """One transcript per (N_i,) waveform at features.sample_rate, decoded by modified beam search
    (or greedy search), `batch_size` waveforms at a time."""
    if method not in ("greedy", "beam"):
        raise ValueError(f"method must be 'greedy' or 'beam'; got {method!r}")
    model.eval()
    texts = []
    for start in range(0, len(waveforms), batch_size):
        chunk = waveforms[start : start + batch_size]
        lengths = torch.tensor([w.numel() for w in chunk])
        padded = torch.zeros(len(chunk), int(lengths.max()))
        for row, waveform in enumerate(chunk):
            padded[row, : waveform.numel()] = waveform
        log_mels, frames = log_mel(padded, features, lengths)
        mask = (torch.arange(log_mels.shape[1])[None, :] < frames[:, None]).long()
        device = model.feature_mean.device
        encoded, encoded_lengths = model.encode(log_mels.to(device), mask.to(device))
        tokens = (modified_beam_search(model, encoded, encoded_lengths, beam) if method == "beam"
                  else greedy_search(model, encoded, encoded_lengths))
        texts += [tokenizer.decode(ids) for ids in tokens]
    return texts


def transcribe_files(name: str | os.PathLike, paths: Sequence[str | os.PathLike], method: Literal["greedy", "beam"] = "beam",
                     beam: int = 4) -> list[str]:
    """Transcripts of WAV files by the zoo model `name`, whose config.json holds its "tokenizer"
    and "features"."""
    config = read_config(name)
    if "tokenizer" not in config or "features" not in config or config.get("arch") != "transducer":
        raise ValueError(f"model {str(name)!r} is not a speech recogniser: expected a transducer with "
                         f"'tokenizer' and 'features' in its config.json")
    features = FeatureConfig(**config["features"])
    tokenizer = TranscriptTokenizer.from_spec(config["tokenizer"])
    waveforms = [read_audio(path, features.sample_rate) for path in paths]
    return transcribe(load(name), waveforms, tokenizer, features, method, beam)
