"""Word error rates of a recogniser on the splits of a synthesised corpus (greedy search, beam search,
beam search with the model's language model), e.g. a Shakespeare-trained model on the modern-English
corpus's held-out text domain and held-out synthesiser.

    python benchmarks/asr_corpus_wer.py [MODEL] [--text modern] [--splits test_domain test_synthesiser] [--limit 200]
"""

from __future__ import annotations

import argparse

from asr.data import CorpusConfig, build_corpus, load_manifest
from asr.transcription import recogniser
from asr.evaluation import word_error_rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default="asr-transducer-tiny")
    parser.add_argument("--text", choices=["shakespeare", "modern"], default="modern")
    parser.add_argument("--splits", nargs="+", default=["test_domain", "test_synthesiser"])
    parser.add_argument("--limit", type=int, default=200, help="utterances per split")
    args = parser.parse_args()
    found = recogniser(args.model)
    folder = build_corpus(CorpusConfig(text=args.text))
    print(f"{args.model} on the {args.text} corpus ({folder.name}), beam {found.beam}, language-model weight "
          f"{found.lm_weight}\n")
    print("| split | utterances | WER greedy | WER beam | WER beam + LM | CER beam + LM |\n|---|---|---|---|---|---|")
    for split in args.splits:
        rows = list(load_manifest(folder / f"{split}.jsonl"))[: args.limit]
        m = word_error_rates(found.model, rows, found.tokenizer, found.features, found.beam, found.language_model,
                             found.lm_weight, found.ilm_weight)
        print(f"| {split} | {m['utterances']} | {m['greedy_wer']:.3f} | {m['beam_wer']:.3f} | {m['lm_wer']:.3f} | "
              f"{m['lm_cer']:.3f} |")
        for example in m["examples"]:
            print(f"|  | | ref: {example['reference']} | hyp: {example['hypothesis']} | | |")


if __name__ == "__main__":
    main()
