"""Streaming against full context: word error rate of a chunk-wise recogniser fed chunk_ms of audio at
a time (`asr.streaming`, greedy) beside the same recogniser decoding each whole utterance (in chunks,
and in full context when it was trained with dynamic chunks) and a full-context recogniser (greedy),
on one split of a synthesised corpus; and the streaming words' delays: decoded (its last token
decoded) and emitted (the word known complete), each less the position in the audio of the encoder
frame its last token came from; medians and 90th percentiles.

    python benchmarks/asr_streaming.py STREAMING_MODEL [--full MODEL] [--text modern] [--split test_domain]
                                       [--chunk-ms 320] [--limit 200] [--kokoro-share 0.3 --kokoro-blend-share 0.5]
"""

from __future__ import annotations

import argparse
import statistics

from asr.data import CorpusConfig, build_corpus, load_manifest, read_audio
from asr.streaming import StreamingTranscriber
from asr.transcription import recogniser, transcribe
from asr.wer import error_counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--full", default=None, help="the full-context recogniser to compare with (default: none)")
    parser.add_argument("--text", choices=["shakespeare", "modern"], default="modern")
    parser.add_argument("--split", default="test_domain")
    parser.add_argument("--chunk-ms", type=int, default=320)
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--kokoro-share", type=float, default=0.0,
                        help="the corpus's CorpusConfig.kokoro_share: it changes only the training split, so "
                             "naming an already synthesised corpus's shares reuses it (default: 0)")
    parser.add_argument("--kokoro-blend-share", type=float, default=0.0)
    args = parser.parse_args()
    corpus = CorpusConfig(text=args.text, kokoro_share=args.kokoro_share, kokoro_blend_share=args.kokoro_blend_share)
    rows = list(load_manifest(build_corpus(corpus) / f"{args.split}.jsonl"))[: args.limit]
    references = [row["text"] for row in rows]
    found = recogniser(args.model)
    streamed, decoded, emitted = [], [], []
    for row in rows:
        waveform = read_audio(row["audio"], found.features.sample_rate)
        stream = StreamingTranscriber(found.model, found.tokenizer, found.features, args.chunk_ms)
        words = stream.stream_recording(waveform)
        streamed.append(stream.text)
        decoded += [w.decoded_at - w.frame_time for w in words]
        emitted += [w.emitted_at - w.frame_time for w in words]
    print(f"{len(rows)} utterances of {args.split} ({args.text}); greedy search\n")
    print("| recogniser | mode | WER | word delay decoded, median / p90 s | word delay emitted, median / p90 s |\n"
          "|---|---|---|---|---|")
    print(f"| {args.model} | streaming, {args.chunk_ms} ms | {error_counts(references, streamed).rate:.4f} | "
          f"{_median_p90(decoded)} | {_median_p90(emitted)} |")
    audio = [row["audio"] for row in rows]
    chunked = stream.model  # the model as it streams (one trained with dynamic chunks: given args.chunk_ms)
    whole = transcribe(chunked, audio, found.tokenizer, found.features, method="greedy")
    print(f"| {args.model} | whole utterances, {args.chunk_ms} ms chunks | {error_counts(references, whole).rate:.4f} | | |")
    if found.model.config.encoder.dynamic_chunks:
        full = transcribe(found.model, audio, found.tokenizer, found.features, method="greedy")
        print(f"| {args.model} | full context | {error_counts(references, full).rate:.4f} | | |")
    if args.full:
        full = transcribe(args.full, audio, method="greedy")
        print(f"| {args.full} | full context | {error_counts(references, full).rate:.4f} | | |")


def _median_p90(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{statistics.median(ordered):.3f} / {ordered[int(0.9 * (len(ordered) - 1))]:.3f}"


if __name__ == "__main__":
    main()
