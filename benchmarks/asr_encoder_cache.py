"""Seconds of one training micro batch (forward and backward of the pruned loss) of the transducer on
Whisper tiny.en's encoder, three ways, on buckets of the modern-English corpus at the quartiles of
utterance length (500 BPE pieces): the encoder training, the encoder frozen but run, and the frozen encoder's
outputs read from `asr.encoder_cache` (what the recipe's head_steps train on).

    python benchmarks/asr_encoder_cache.py [--threads 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from asr.data import (CorpusConfig, DurationBuckets, SpeechExamples, build_corpus, collate_speech, load_manifest,
                      training_text_sentences)
from asr.encoder_cache import EncodedExamples
from asr.text import TranscriptTokenizer
from recipes.asr_transducer import ASRTransducerConfig, build_model

BUCKET = 16
PIECES = 500
"""BPE pieces, learnt from the training text as the recipe's --tokens bpe --lm_text training_text does."""


def seconds(model: torch.nn.Module, batch: dict[str, torch.Tensor], repeats: int) -> float:
    """Median seconds of forward + backward of batch's loss."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        model(**batch)["loss"].backward()
        times.append(time.perf_counter() - started)
        model.zero_grad(set_to_none=True)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    corpus = CorpusConfig(text="modern")
    rows = list(load_manifest(build_corpus(corpus) / "train.jsonl"))
    tokenizer = TranscriptTokenizer.train_bpe(training_text_sentences(corpus), PIECES)
    order = sorted(range(len(rows)), key=lambda i: rows[i]["seconds"])
    chosen = [order[int(q * (len(order) - BUCKET))] for q in (0.25, 0.5, 0.75)]
    picked = [rows[i] for start in chosen for i in order[order.index(start) : order.index(start) + BUCKET]]
    examples = SpeechExamples(picked, tokenizer)
    torch.manual_seed(0)
    model = build_model(ASRTransducerConfig(encoder="whisper-tiny.en"), tokenizer.vocab_size).train()
    with tempfile.TemporaryDirectory() as root:
        encoded = EncodedExamples.build(model, examples, root=Path(root))
        print(f"{args.threads} thread(s), buckets of {BUCKET} utterances, {PIECES} BPE pieces, median of {args.repeats} "
              "(forward + backward, seconds)\n")
        print("| bucket | seconds of audio per utterance | encoder trains | encoder frozen, run | cached outputs |")
        print("|---|---|---|---|---|")
        for quartile, groups in zip((1, 2, 3), DurationBuckets(examples, BUCKET).groups):
            features = collate_speech([examples[i] for i in groups])
            cached = collate_speech([encoded[i] for i in groups])
            model.encoder.requires_grad_(True)
            trained = seconds(model, features, args.repeats)
            model.encoder.requires_grad_(False)
            frozen = seconds(model, features, args.repeats)
            from_cache = seconds(model, cached, args.repeats)
            mean = sum(examples.seconds[i] for i in groups) / len(groups)
            print(f"| quartile {quartile} | {mean:.2f} | {trained:.3f} | {frozen:.3f} | {from_cache:.3f} |")


if __name__ == "__main__":
    main()
