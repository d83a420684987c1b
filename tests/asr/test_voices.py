"""Synthetic speakers: espeak-ng, flite, Kokoro and piper each speak a sentence into a 16 kHz WAV whose
length follows the speed, Kokoro's voices and a blend of two are read by Whisper, and the held-out
voices never meet the training ones."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest
from scipy.io import wavfile

from asr import kokoro
from asr.data import read_audio
from asr.text import normalize
from asr.voices import (FLITE_VOICES, KOKORO_BLENDS, KOKORO_UNSEEN_BLENDS, KOKORO_VOICES, PIPER_VOICES, Voice,
                        flite_voice, kokoro_blend, kokoro_voice, speak, unseen_kokoro_voice, voices)
from asr.wer import error_counts
from asr.whisper_reference import WhisperReader

SENTENCE = "my neighbour takes the number nine bus to the market every tuesday"


@pytest.mark.parametrize("voice", [Voice("en-gb", "f3", 170, 50), Voice("flite", "slt", 170, 50, "flite"),
                                   Voice("kokoro", "jm_kumo", 170, 50, "kokoro"), Voice("piper", "joe", 170, 50, "piper")],
                         ids=lambda v: v.synthesiser)
def test_each_synthesiser_speaks_at_16_khz_and_its_speed_sets_the_length(voice, tmp_path):
    seconds = speak(SENTENCE, voice, tmp_path / "normal.wav")
    rate, samples = wavfile.read(tmp_path / "normal.wav")
    assert rate == 16000 and samples.ndim == 1 and samples.dtype.name == "int16"
    assert 2.0 < seconds < 6.0 and seconds == pytest.approx(len(samples) / 16000)
    assert abs(samples).max() > 3000  # sound, not silence
    # 140 against 220 words per minute: piper pads with silence that does not scale, so its
    # 170-against-220 ratio, about 0.87, is too close to call.
    slow, fast = (Voice(voice.accent, voice.variant, speed, voice.pitch, voice.synthesiser) for speed in (140, 220))
    assert speak(SENTENCE, fast, tmp_path / "fast.wav") < 0.9 * speak(SENTENCE, slow, tmp_path / "slow.wav")


def test_piper_speaks_a_clip_the_same_in_any_order_and_process(tmp_path):
    """VITS draws noise for its durations and pitch: a clip's own seeded session makes it reproducible."""
    voice, other = Voice("piper", "joe", 170, 50, "piper"), Voice("piper", "joe", 180, 50, "piper")
    first = speak(SENTENCE, voice, tmp_path / "first.wav")
    speak(SENTENCE, other, tmp_path / "other.wav")
    assert speak(SENTENCE, voice, tmp_path / "again.wav") == first
    assert (tmp_path / "again.wav").read_bytes() == (tmp_path / "first.wav").read_bytes()
    elsewhere = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; from asr.voices import Voice, speak; "
                                "print(speak(sys.argv[1], Voice('piper', 'joe', 170, 50, 'piper'), Path(sys.argv[2])))",
                                SENTENCE, str(tmp_path / "elsewhere.wav")], capture_output=True, text=True, check=True,
                               timeout=120, env=os.environ | {"OMP_NUM_THREADS": "1"})
    assert float(elsewhere.stdout.split()[-1]) == first
    assert (tmp_path / "elsewhere.wav").read_bytes() == (tmp_path / "first.wav").read_bytes()


def test_training_flite_and_kokoro_and_held_out_piper_voices():
    rng = random.Random(0)
    drawn = [flite_voice(rng) for _ in range(200)]
    assert {v.variant for v in drawn} == set(FLITE_VOICES) and all(v.synthesiser == "flite" for v in drawn)
    drawn = [kokoro_voice(rng) for _ in range(200)]
    assert {v.variant for v in drawn} == set(KOKORO_VOICES) and all(v.name == f"kokoro+{v.variant}" for v in drawn)
    blends = [kokoro_blend(rng) for _ in range(200)]
    assert {v.variant for v in blends} == set(KOKORO_BLENDS) and len(KOKORO_BLENDS) == 10
    assert all(v.synthesiser == "kokoro" and set(v.variant.split("~")) <= set(KOKORO_VOICES) for v in blends)
    unseen = [unseen_kokoro_voice(rng) for _ in range(200)]  # validation's natural speakers: three voices each
    assert {v.variant for v in unseen} == set(KOKORO_UNSEEN_BLENDS) and len(KOKORO_UNSEEN_BLENDS) == 10
    assert all(len(set(v.variant.split("~")) & set(KOKORO_VOICES)) == 3 for v in unseen)
    assert {v.speed for v in drawn} <= set(range(140, 201)) and len({v.speed for v in drawn}) > 30
    piper = voices("synthesiser", 50, rng)
    assert all(v.synthesiser == "piper" and v.variant in PIPER_VOICES and v.name == f"piper+{v.variant}" for v in piper)
    assert all(v.synthesiser == "espeak" for v in voices("none", 50, rng))
    with pytest.raises(ValueError, match="held_out must be one of"):
        voices("flite", 1, rng)


KOKORO_SENTENCES = ("the kitchen light went out on thursday so we ate dinner by candlelight",
                    "please remind your brother to return the library books before the weekend",
                    "our neighbours painted their fence bright yellow last summer",
                    "the bus was twenty minutes late because of the roadworks on the high street")


@pytest.mark.timeout(300)
def test_kokoro_has_a_letter_for_every_phoneme_espeak_writes_and_whisper_reads_its_voices(tmp_path):
    _, vocabulary, styles = kokoro._model()
    assert set(styles) == set(KOKORO_VOICES) and all(table.shape == (510, 1, 256) for table in styles.values())
    for sentence in KOKORO_SENTENCES:
        ipa = kokoro.phonemes(sentence)
        assert not set(ipa) - set(vocabulary), f"{sentence!r} -> {ipa!r}: no token for {set(ipa) - set(vocabulary)}"
        assert not any(pair in ipa for pair, _ in kokoro.MISAKI_LETTERS)  # diphthongs as Kokoro's single letters
    blend = kokoro.style_table("jf_alpha~jm_kumo")
    assert blend.shape == (510, 1, 256) and abs(blend - (styles["jf_alpha"] + styles["jm_kumo"]) / 2).max() < 1e-6
    trio = kokoro.style_table("jf_gongitsune~jf_nezumi~jm_kumo")
    assert abs(trio - (styles["jf_gongitsune"] + styles["jf_nezumi"] + styles["jm_kumo"]) / 3).max() < 1e-6
    # The widest blend speaks every sentence (three voices' styles through the synthesiser at once;
    # the blend's arithmetic is checked above).
    variant = "jf_gongitsune~jf_nezumi~jm_kumo"
    paths = [tmp_path / f"{i}.wav" for i in range(len(KOKORO_SENTENCES))]
    for sentence, path in zip(KOKORO_SENTENCES, paths):
        speak(sentence, Voice("kokoro", variant, 170, 50, "kokoro"), path)
    heard = WhisperReader().read([read_audio(path, 16000).numpy() for path in paths])
    assert error_counts([normalize(s) for s in KOKORO_SENTENCES], heard).rate <= 0.25, heard
    for wrong in ("af_heart", "jm_kumo~jm_kumo", "jf_alpha~jm_kumo~jf_nezumi~jf_tebukuro", "jf_alpha~af_heart"):
        with pytest.raises(ValueError, match=f"Kokoro voice must be one of .* or two or three of them joined by '~'; got '{wrong}'"):
            kokoro.synthesise("hello", wrong, 1.0)
    with pytest.raises(ValueError, match="Kokoro speaks 1 to 510 phonemes"):
        kokoro.synthesise("hello " * 200, "jm_kumo", 1.0)


@pytest.mark.timeout(120)
def test_kokoro_loads_once_when_threads_ask_at_once_on_a_fresh_machine(tmp_path):
    # Corpus building's first syntheses run on four threads at once; each once assembled the model's
    # file from its part packages into the same temporary file, and all but one failed.
    script = ("from concurrent.futures import ThreadPoolExecutor\n"
              "from asr import kokoro\n"
              "with ThreadPoolExecutor(4) as pool:\n"
              "    clips = list(pool.map(lambda v: kokoro.synthesise('five buses', v, 1.0), ['jm_kumo'] * 4))\n"
              "print(len({len(c) for c in clips}), min(len(c) for c in clips))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "KOKORO_JA_CACHE": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    distinct, shortest = map(int, done.stdout.split())
    assert distinct == 1 and shortest > 0.3 * kokoro.SAMPLE_RATE  # the same clip four times, about 1 s of speech
    assert [path.name for path in tmp_path.iterdir()] == ["kokoro-v1.0.int8.onnx"]
