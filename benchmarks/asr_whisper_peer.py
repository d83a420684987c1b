"""Whisper tiny.en itself, the peer of the pretrained-encoder transducer (`asr.whisper_reference`),
on the recipe's held-out sets of the modern-English corpus and the real recordings.

    python benchmarks/asr_whisper_peer.py [--limit 100] [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import ctranslate2

from asr.data import CorpusConfig, build_corpus, load_manifest, read_audio, recorded_speech
from asr.text import normalize
from asr.wer import error_counts
from asr.whisper_reference import SAMPLE_RATE, WhisperReader

SETS = ("test_domain", "test_synthesiser", "test_voices", "test_accent")
RECORDED = ("librivox", "cards")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=100, help="utterances of each synthetic set")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    reader = WhisperReader(args.threads)
    corpus = build_corpus(CorpusConfig(text="modern"))
    sets = {name: list(load_manifest(corpus / f"{name}.jsonl"))[: args.limit] for name in SETS}
    recorded = recorded_speech()
    sets |= {name: [row for row in recorded if row["set"] == name] for name in RECORDED}
    print(f"Whisper tiny.en (CTranslate2 {ctranslate2.__version__}, greedy), {args.threads} thread(s)\n")
    print("| set | utterances | WER | CER | seconds |")
    print("|---|---|---|---|---|")
    for name, rows in sets.items():
        started = time.perf_counter()
        hypotheses = reader.read([read_audio(row["audio"], SAMPLE_RATE).numpy() for row in rows])
        references = [normalize(row["text"]) for row in rows]
        print(f"| {name} | {len(rows)} | {error_counts(references, hypotheses).rate:.4f} | "
              f"{error_counts(references, hypotheses, 'char').rate:.4f} | {time.perf_counter() - started:.0f} |")


if __name__ == "__main__":
    main()
