"""`zoo transcribe` on awkward audio with the shipped `asr-transducer-tiny`: a long recording is
segmented and transcribed as well as its sentences alone; silent and very short audio give empty
transcripts; clipped, 8 kHz and stereo audio transcribe; empty files and files that are no WAV get
an error naming them; quiet and loud recordings are levelled to the training level first."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from scipy.io import wavfile

from asr import transcribe
from asr.data import CorpusConfig, read_audio, split_sentences
from asr.features import resample
from asr.voices import speak, voices
from asr.wer import error_counts
from helpers import zoo_in_process

ZOO = str(Path(sys.executable).parent / "zoo")
MODEL = "asr-transducer-tiny"


@pytest.fixture(scope="module")
def sentences(tmp_path_factory) -> tuple[list[str], list[Path]]:
    """12 held-out test sentences spoken by training voices, one WAV each."""
    folder = tmp_path_factory.mktemp("sentences")
    texts = split_sentences(CorpusConfig())[2][:12]
    paths = [folder / f"{i}.wav" for i in range(len(texts))]
    for text, voice, path in zip(texts, voices("none", len(texts), random.Random(0)), paths):
        speak(text, voice, path)
    return texts, paths


def write_wav(path: Path, rate: int, samples: torch.Tensor) -> Path:
    """float samples (N,) or (N, C) in [-1, 1] as 16-bit PCM."""
    wavfile.write(path, rate, (samples.clamp(-1, 32767 / 32768) * 32768).round().short().numpy())
    return path


def test_a_long_recording_is_segmented_and_transcribed_as_its_sentences_alone(sentences, tmp_path):
    texts, paths = sentences
    pause = torch.zeros(8000)
    waves = [read_audio(path, 16000) for path in paths]
    recording = torch.cat([torch.cat([w, pause]) for w in waves])  # 28 s: longer than one 20 s segment
    assert recording.numel() > 25 * 16000
    alone = error_counts(texts, transcribe(MODEL, paths, method="greedy")).rate
    (whole,) = transcribe(MODEL, [recording], method="greedy")
    together = error_counts([" ".join(texts)], [whole]).rate
    # measured: 0.113 for the sentences alone, 0.155 for the recording (the segments' edges differ a little)
    assert alone <= 0.2 and together <= alone + 0.08
    long_file = write_wav(tmp_path / "ten_minutes.wav", 16000, recording.repeat(22)[: 600 * 16000])
    done = subprocess.run([ZOO, "transcribe", MODEL, str(long_file), "--method", "greedy"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(done.stdout.split()) > 21 * len(whole.split())  # every repeat of the 28 s transcribed


def test_silent_and_very_short_audio_transcribe_to_nothing(sentences):
    _, paths = sentences
    speech = read_audio(paths[0], 16000)
    assert transcribe(MODEL, [torch.zeros(32000), torch.zeros(30 * 16000), speech[:800], 1e-6 * speech]) == [""] * 4


def test_quiet_and_loud_recordings_transcribe_as_at_the_training_level(sentences):
    texts, paths = sentences
    waves = [read_audio(path, 16000) for path in paths]
    rates = [error_counts(texts, transcribe(MODEL, [gain * w for w in waves], method="greedy")).rate
             for gain in (1.0, 0.05, 4.0)]
    # measured 0.113 at every gain from 0.03 to 1 (without levelling: 0.394 at 0.3, 0.986 at 0.1)
    assert rates[1] == rates[0] and rates[2] <= rates[0] + 0.03


def test_clipped_8_khz_and_stereo_audio_transcribe(sentences, tmp_path):
    texts, paths = sentences
    speech = read_audio(paths[1], 16000).double()
    clipped = write_wav(tmp_path / "clipped.wav", 16000, (8 * speech).clamp(-1, 1))
    narrow = write_wav(tmp_path / "8k.wav", 8000, resample(speech, 16000, 8000))
    stereo = write_wav(tmp_path / "stereo.wav", 16000, torch.stack([speech, 0.5 * speech], dim=1))
    heard = transcribe(MODEL, [clipped, narrow, stereo])
    rates = [error_counts([texts[1]], [text]).rate for text in heard]
    assert rates[0] <= 0.5 and rates[2] <= 0.2 and rates[1] <= 1.0 and heard[1]  # 8 kHz: half the band the model knows


def test_empty_and_non_wav_files_get_an_error_naming_them(tmp_path, capsys):
    empty = write_wav(tmp_path / "empty.wav", 16000, torch.zeros(0))
    text = tmp_path / "notes.wav"
    text.write_text("not audio at all\n")
    with pytest.raises(ValueError, match=f"empty audio '{empty}'"):
        transcribe(MODEL, [empty])
    done = zoo_in_process(capsys, "transcribe", MODEL, str(text))
    assert done.returncode != 0 and f"unreadable audio '{text}'" in done.stderr and "Traceback" not in done.stderr
