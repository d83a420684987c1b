"""Whisper tiny.en itself, the peer of the pretrained-encoder transducer: its own encoder and decoder
(CTranslate2, the packaged model.bin the transducer's encoder is imported from; greedy, 30 s windows
as Whisper reads them) on the recipe's held-out sets of the modern-English corpus and the real
recordings, its text put in spoken form (`asr.spoken_form`) and normalised as the references are.

    python benchmarks/asr_whisper_peer.py [--limit 100] [--threads 2]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import ctranslate2
import numpy as np
import tokenizers
from transformers import WhisperFeatureExtractor

from asr.data import CorpusConfig, build_corpus, load_manifest, read_audio, recorded_speech
from asr.features import FeatureConfig
from asr.spoken_form import spoken_form
from asr.text import normalize
from asr.wer import error_counts
from asr.whisper_encoder import packaged_whisper_tiny_en

SETS = ("test_domain", "test_synthesiser", "test_voices", "test_accent")
RECORDED = ("librivox", "cards")
BATCH = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=100, help="utterances of each synthetic set")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    folder = Path(packaged_whisper_tiny_en()).parent
    model = ctranslate2.models.Whisper(str(folder), device="cpu", intra_threads=args.threads)
    tokenizer = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    extractor = WhisperFeatureExtractor(feature_size=80)
    prompt = [tokenizer.token_to_id("<|startoftranscript|>"), tokenizer.token_to_id("<|notimestamps|>")]
    corpus = build_corpus(CorpusConfig(text="modern"))
    sets = {name: list(load_manifest(corpus / f"{name}.jsonl"))[: args.limit] for name in SETS}
    recorded = recorded_speech()
    sets |= {name: [row for row in recorded if row["set"] == name] for name in RECORDED}
    rate = FeatureConfig().sample_rate
    print(f"Whisper tiny.en (CTranslate2 {ctranslate2.__version__}, greedy), {args.threads} thread(s)\n")
    print("| set | utterances | WER | CER | seconds |")
    print("|---|---|---|---|---|")
    for name, rows in sets.items():
        started, hypotheses = time.perf_counter(), []
        for start in range(0, len(rows), BATCH):
            audio = [read_audio(row["audio"], rate).numpy() for row in rows[start : start + BATCH]]
            features = extractor(audio, sampling_rate=rate, return_tensors="np").input_features
            results = model.generate(ctranslate2.StorageView.from_array(np.ascontiguousarray(features)),
                                     [prompt] * len(audio), beam_size=1)
            hypotheses += [normalize(spoken_form(tokenizer.decode(r.sequences_ids[0]))) for r in results]
        references = [normalize(row["text"]) for row in rows]
        print(f"| {name} | {len(rows)} | {error_counts(references, hypotheses).rate:.4f} | "
              f"{error_counts(references, hypotheses, 'char').rate:.4f} | {time.perf_counter() - started:.0f} |")


if __name__ == "__main__":
    main()
