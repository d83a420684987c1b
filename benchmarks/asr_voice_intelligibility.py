"""How intelligible each synthetic voice is: Whisper tiny.en's greedy WER (`asr.whisper_reference`)
on the same held-out sentences (the modern corpus's test_domain, a text source never trained on)
spoken by every flite and Kokoro voice, the blends of Kokoro's, piper's (held out) and two espeak-ng
voices, with the seconds each synthesis took on one thread per real second of speech.

    python benchmarks/asr_voice_intelligibility.py [--sentences 8] [--match "~"]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from asr.data import CorpusConfig, DOMAIN_SPLIT, corpus_plan, read_audio
from asr.text import normalize
from asr.voices import FLITE_VOICES, KOKORO_BLENDS, KOKORO_VOICES, PIPER_VOICES, NOMINAL_SPEED, Voice, speak
from asr.wer import error_counts
from asr.whisper_reference import SAMPLE_RATE, WhisperReader

VOICES = ([Voice("en-us", "m1", NOMINAL_SPEED, 50), Voice("en-gb", "f3", NOMINAL_SPEED, 50)]
          + [Voice("flite", v, NOMINAL_SPEED, 50, "flite") for v in FLITE_VOICES]
          + [Voice("kokoro", v, NOMINAL_SPEED, 50, "kokoro") for v in KOKORO_VOICES + KOKORO_BLENDS]
          + [Voice("piper", v, NOMINAL_SPEED, 50, "piper") for v in PIPER_VOICES])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=8, help="test_domain sentences each voice speaks")
    parser.add_argument("--match", default="", help="only the voices whose name (e.g. kokoro+jf_alpha~jm_kumo) holds this")
    args = parser.parse_args()
    texts = [text for text, _ in corpus_plan(CorpusConfig(text="modern"))[0][DOMAIN_SPLIT]][: args.sentences]
    references = [normalize(text) for text in texts]
    reader = WhisperReader(threads=1)
    print(f"Whisper tiny.en (greedy) on {len(texts)} test_domain sentences, each voice at {NOMINAL_SPEED} words a minute\n")
    print("| synthesiser | voice | WER | CER | synthesis s per s of speech |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for voice in [v for v in VOICES if args.match in v.name]:
            started, seconds = time.perf_counter(), 0.0
            paths = [Path(folder) / f"{voice.variant}_{i}.wav" for i in range(len(texts))]
            for text, path in zip(texts, paths):
                seconds += speak(text, voice, path)
            cost = (time.perf_counter() - started) / seconds
            hypotheses = reader.read([read_audio(path, SAMPLE_RATE).numpy() for path in paths])
            print(f"| {voice.synthesiser} | {voice.variant if voice.synthesiser != 'espeak' else voice.name} | "
                  f"{error_counts(references, hypotheses).rate:.3f} | {error_counts(references, hypotheses, 'char').rate:.3f} | "
                  f"{cost:.2f} |", flush=True)


if __name__ == "__main__":
    main()
