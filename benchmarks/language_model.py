"""Seconds to count the recipe's token n-gram language model and to load a shipped one.

    python benchmarks/language_model.py

Counts `asr.language_model.NgramLanguageModel` at order 8 over the modern training text and
WordNet's usage examples in a 128-piece BPE (what `zoo train asr_transducer --lm_sources wordnet`
builds per tuning fold), and loads asr-transducer-whisper-tiny's language model; the median of 3
runs each. BENCHMARKS.md, "The suite's time, session 63".
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asr.data import CorpusConfig, language_model_sentences, training_text_sentences  # noqa: E402
from asr.language_model import NgramLanguageModel  # noqa: E402
from asr.text import TranscriptTokenizer  # noqa: E402
from asr.word_language_model import load_language_model  # noqa: E402
from zoo.store import locate  # noqa: E402


def median_seconds(run, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    corpus = CorpusConfig(text="modern")
    text = training_text_sentences(corpus)
    sentences = text + language_model_sentences(corpus, ("wordnet",))
    tokenizer = TranscriptTokenizer.train_bpe(text, 128)
    ids = [tokenizer.encode(sentence) for sentence in sentences]
    counted = median_seconds(lambda: NgramLanguageModel.train(ids, tokenizer.vocab_size, 8))
    print(f"count: {len(sentences)} sentences, {sum(map(len, ids))} tokens, order 8: {counted:.2f} s")
    path = locate("asr-transducer-whisper-tiny") / "language_model.safetensors"
    print(f"load: {path.stat().st_size} bytes: {median_seconds(lambda: load_language_model(path)):.2f} s")


if __name__ == "__main__":
    main()
