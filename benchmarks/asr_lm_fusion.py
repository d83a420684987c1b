"""Word error rate of a trained transducer's beam search with and without a language model of
the training transcripts (a word n-gram model spelled through its lexicon, or a token n-gram
model), over beams, language models, their weights and those of the internal language model
subtracted in the fusion, on the synthesised corpus's splits (`asr.data.SPLITS`); and on unseen
speakers, split by voice variant.

    python benchmarks/asr_lm_fusion.py MODEL [--splits validation] [--beams 8 16]
                                             [--language-models word:4 token:8] [--weights 0 0.4 0.6]
                                             [--ilm-weights 0 0.2] [--by-voice]

MODEL: a folder or zoo name written by the asr_transducer recipe with character tokens (its corpus
must have the default CorpusConfig's sentences; extra or synthetic accents only change training voices). Weight 0 is plain beam search (no internal model is subtracted then).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

from asr.data import CorpusConfig, build_corpus, load_manifest, read_audio
from asr.language_model import NgramLanguageModel
from asr.transcription import recogniser, transcribe
from asr.wer import error_counts
from asr.word_language_model import WordLanguageModel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--splits", nargs="+", default=["validation"])
    parser.add_argument("--beams", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--language-models", nargs="+", default=["word:4", "token:8"], metavar="UNIT:ORDER",
                        help="word:N (word N-gram through the lexicon) or token:N (token N-gram)")
    parser.add_argument("--weights", type=float, nargs="+", default=[0.0, 0.4, 0.6])
    parser.add_argument("--ilm-weights", type=float, nargs="+", default=[0.0])
    parser.add_argument("--by-voice", action="store_true", help="split test_voices by voice variant")
    args = parser.parse_args()
    found = recogniser(args.model)
    folder = build_corpus(CorpusConfig())
    transcripts = list(load_manifest(folder / "train.jsonl")["text"])
    for spec in args.language_models:
        unit, order = spec.split(":")
        lm = (WordLanguageModel.train(transcripts, int(order)) if unit == "word" else
              NgramLanguageModel.train([found.tokenizer.encode(t) for t in transcripts], found.model.config.vocab_size, int(order)))
        size = (f"{len(lm.lexicon):,} words, {len(lm.word_model.counts):,} distinct {order}-grams" if unit == "word"
                else f"{len(lm.counts):,} distinct {order}-grams")
        print(f"\n{unit} {order}-gram: {size}, {len(lm.to_bytes()):,} bytes\n")
        print("| split | beam | language model | weight | internal weight | WER | CER | decoding s |\n"
              "|---|---|---|---|---|---|---|---|")
        for split in args.splits:
            rows = list(load_manifest(folder / f"{split}.jsonl"))
            waveforms, references = [read_audio(r["audio"], 16000) for r in rows], [r["text"] for r in rows]
            for beam in args.beams:
                for weight, internal in [(w, i) for w in args.weights for i in (args.ilm_weights if w else [0.0])]:
                    started = time.perf_counter()
                    hypotheses = transcribe(found.model, waveforms, found.tokenizer, found.features, beam=beam,
                                            language_model=lm, lm_weight=weight, ilm_weight=internal)
                    seconds = time.perf_counter() - started
                    print(f"| {split} | {beam} | {spec if weight else '-'} | {weight} | {internal} | "
                          f"{error_counts(references, hypotheses).rate:.4f} | "
                          f"{error_counts(references, hypotheses, 'char').rate:.4f} | {seconds:.0f} |", flush=True)
                    if args.by_voice and split == "test_voices":
                        by_variant(rows, hypotheses)


def by_variant(rows: list[dict], hypotheses: list[str]) -> None:
    """WER and CER of each voice variant among `rows`."""
    groups: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for row, hypothesis in zip(rows, hypotheses):
        groups[f"variant {row['voice'].split('+')[1]}"].append((row["text"], hypothesis))
    for group, pairs in sorted(groups.items()):
        references, said = [list(x) for x in zip(*pairs)]
        print(f"|   {group} ({len(pairs)} clips) | | | | | {error_counts(references, said).rate:.4f} | "
              f"{error_counts(references, said, 'char').rate:.4f} | |")


if __name__ == "__main__":
    main()
