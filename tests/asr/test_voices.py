"""Synthetic speakers: espeak-ng, flite and piper each speak a sentence into a 16 kHz WAV whose
length follows the speed, and the held-out voices never meet the training ones."""

from __future__ import annotations

import random

import pytest
from scipy.io import wavfile

from asr.voices import FLITE_VOICES, PIPER_VOICES, Voice, flite_voice, speak, voices

SENTENCE = "my neighbour takes the number nine bus to the market every tuesday"


@pytest.mark.parametrize("voice", [Voice("en-gb", "f3", 170, 50), Voice("flite", "slt", 170, 50, "flite"),
                                   Voice("piper", "joe", 170, 50, "piper")], ids=lambda v: v.synthesiser)
def test_each_synthesiser_speaks_at_16_khz_and_its_speed_sets_the_length(voice, tmp_path):
    seconds = speak(SENTENCE, voice, tmp_path / "normal.wav")
    rate, samples = wavfile.read(tmp_path / "normal.wav")
    assert rate == 16000 and samples.ndim == 1 and samples.dtype.name == "int16"
    assert 2.0 < seconds < 6.0 and seconds == pytest.approx(len(samples) / 16000)
    assert abs(samples).max() > 3000  # sound, not silence
    # 140 against 220 words per minute: piper draws its durations at random (a few percent apart run to run)
    # and pads with silence that does not scale, so its 170-against-220 ratio, about 0.87, is too close to call.
    slow, fast = (Voice(voice.accent, voice.variant, speed, voice.pitch, voice.synthesiser) for speed in (140, 220))
    assert speak(SENTENCE, fast, tmp_path / "fast.wav") < 0.9 * speak(SENTENCE, slow, tmp_path / "slow.wav")


def test_training_flite_and_held_out_piper_voices():
    rng = random.Random(0)
    drawn = [flite_voice(rng) for _ in range(200)]
    assert {v.variant for v in drawn} == set(FLITE_VOICES) and all(v.synthesiser == "flite" for v in drawn)
    piper = voices("synthesiser", 50, rng)
    assert all(v.synthesiser == "piper" and v.variant in PIPER_VOICES and v.name == f"piper+{v.variant}" for v in piper)
    assert all(v.synthesiser == "espeak" for v in voices("none", 50, rng))
    with pytest.raises(ValueError, match="held_out must be one of"):
        voices("flite", 1, rng)
