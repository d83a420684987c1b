"""Spoken digits for the keyword spotter: the Free Spoken Digit Dataset's recordings as MFCCs, and
synthetic speakers saying the ten digits.

The Free Spoken Digit Dataset (FSDD, github.com/Jakobovski/free-spoken-digit-dataset, CC BY-SA
4.0): 3,000 recordings at 8 kHz, each of six speakers saying each digit 50 times. The package ships
their `keyword_mfccs` (one centred second each, `asr/assets/fsdd_mfccs.npz`, float16, CC BY-SA 4.0
as the recordings are; `write_fsdd_mfccs` made it from the repository's recordings/; attribution and
source in asr/assets/FSDD.md), so that training needs no download. Synthetic speakers (`asr.voices`: espeak-ng's accents and variants, flite's
voices) say the digits at FSDD's bandwidth, placed at random in their second.
"""

from __future__ import annotations

import random
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from asr.features import resample
from asr.keywords import CLIP_SAMPLES, SAMPLE_RATE, centred_clip, keyword_mfccs
from asr.voices import ACCENTS, FLITE_VOICES, VARIANTS, Voice, speak

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
"""The words the classes are, by class id."""
FSDD_SPEAKERS = ("george", "jackson", "lucas", "nicolas", "theo", "yweweler")
"""FSDD's speakers (recordings are named digit_speaker_index.wav)."""
FSDD_RATE = 8000
"""FSDD's sample rate (Hz); synthetic speech is band-limited to it."""
FSDD_ASSET = "fsdd_mfccs.npz"


@dataclass(frozen=True)
class SpokenDigits:
    """Clips of spoken digits as keyword MFCCs."""

    features: torch.Tensor
    """(N, 1, 49, 10) float32 `keyword_mfccs`, not normalised."""
    digits: torch.Tensor
    """(N,) int64 class ids (DIGIT_WORDS)."""
    speakers: tuple[str, ...]
    """Who says each clip: an FSDD speaker, or a synthetic voice's name."""
    names: tuple[str, ...]
    """Each clip's name: its FSDD file's stem (digit_speaker_index), or "voice speed word"."""

    def __len__(self) -> int:
        return len(self.digits)

    def select(self, keep: torch.Tensor) -> SpokenDigits:
        """The clips where the boolean mask `keep` (N,) is true."""
        chosen = keep.nonzero().squeeze(1).tolist()
        return SpokenDigits(self.features[keep], self.digits[keep], tuple(self.speakers[i] for i in chosen),
                            tuple(self.names[i] for i in chosen))

    @staticmethod
    def join(*sets: SpokenDigits) -> SpokenDigits:
        return SpokenDigits(torch.cat([s.features for s in sets]), torch.cat([s.digits for s in sets]),
                            tuple(speaker for s in sets for speaker in s.speakers),
                            tuple(name for s in sets for name in s.names))


def fsdd_mfccs() -> SpokenDigits:
    """FSDD's 3,000 recordings as shipped (`asr/assets/fsdd_mfccs.npz`), in file-name order."""
    with resources.files("asr").joinpath("assets", FSDD_ASSET).open("rb") as file, np.load(file) as saved:
        return SpokenDigits(torch.from_numpy(saved["features"].astype(np.float32)),
                            torch.from_numpy(saved["digits"]).long(), tuple(str(s) for s in saved["speakers"]),
                            tuple(str(n) for n in saved["names"]))


def fsdd_clip(path: str | Path) -> torch.Tensor:
    """An FSDD recording (or any mono WAV) as its centred second at 16 kHz (`centred_clip`)."""
    from scipy.io import wavfile

    rate, samples = wavfile.read(path)
    if samples.ndim != 1:
        raise ValueError(f"{path}: expected a mono WAV; got {samples.shape[1]} channels")
    scale = 32768.0 if samples.dtype == np.int16 else 1.0
    return centred_clip(torch.from_numpy(samples.astype(np.float32) / scale), rate)


def write_fsdd_mfccs(recordings: str | Path, path: str | Path) -> int:
    """Write the MFCCs of FSDD's recordings/ (digit_speaker_index.wav) as the shipped asset; returns
    the number of clips."""
    files = sorted(Path(recordings).glob("*.wav"))
    if not files:
        raise ValueError(f"no .wav files in {recordings}")
    parts = [file.stem.split("_") for file in files]
    features = torch.stack([keyword_mfccs(fsdd_clip(file)) for file in files])
    np.savez_compressed(path, features=features.numpy().astype(np.float16), digits=np.array([int(p[0]) for p in parts]),
                        speakers=np.array([p[1] for p in parts]), names=np.array([file.stem for file in files]))
    return len(files)


def synthetic_voices(espeak: int, flite_speeds: tuple[int, ...], rng: random.Random) -> list[Voice]:
    """`espeak` random espeak-ng voices (accent, variant, speed 110-200 words a minute, pitch 20-80)
    and each flite voice at each of `flite_speeds`."""
    voices = [Voice(rng.choice(ACCENTS), rng.choice(VARIANTS), rng.randint(110, 200), rng.randint(20, 80))
              for _ in range(espeak)]
    return voices + [Voice("flite", name, speed, 50, "flite") for name in FLITE_VOICES for speed in flite_speeds]


def synthetic_digits(voices: list[Voice], rng: random.Random) -> SpokenDigits:
    """Each voice saying each digit: band-limited to FSDD's 4 kHz, trimmed to where it is above 2% of
    its peak (25 ms kept either side), scaled to a peak of 0.3-1 and placed at random in a second."""
    from scipy.io import wavfile

    features, digits, speakers, names = [], [], [], []
    margin = SAMPLE_RATE // 40
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "digit.wav"
        for voice in voices:
            for digit, word in enumerate(DIGIT_WORDS):
                speak(word, voice, path, SAMPLE_RATE)
                samples = torch.from_numpy(wavfile.read(path)[1].astype(np.float32) / 32768)
                samples = resample(resample(samples, SAMPLE_RATE, FSDD_RATE), FSDD_RATE, SAMPLE_RATE)
                peak = samples.abs().max().clamp_min(1e-4)
                loud = (samples.abs() > 0.02 * peak).nonzero().squeeze(1)
                if len(loud):
                    samples = samples[max(0, loud[0] - margin):loud[-1] + margin]
                samples = samples[:CLIP_SAMPLES] * (rng.uniform(0.3, 1.0) / peak)
                start = rng.randint(0, CLIP_SAMPLES - samples.numel())
                features.append(keyword_mfccs(centred_clip(samples, SAMPLE_RATE, start)))
                digits.append(digit)
                speakers.append(f"{voice.synthesiser}:{voice.name}")
                names.append(f"{voice.synthesiser}:{voice.name} {voice.speed} {word}")
    return SpokenDigits(torch.stack(features), torch.tensor(digits), tuple(speakers), tuple(names))
