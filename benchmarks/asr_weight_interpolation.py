"""Word error rates of a fine-tuned Whisper-encoder transducer whose encoder weights are moved back
toward Whisper tiny.en's own: encoder = alpha x fine-tuned + (1 - alpha) x pretrained, the decoder
and joiner kept (WiSE-FT, Wortsman et al., 2022, weight-space ensembling of a fine-tuned model with
its zero-shot start; alpha as the paper has it), on a corpus's splits; alpha 1 is the model itself.

    python benchmarks/asr_weight_interpolation.py [MODEL] --corpus FOLDER [--alphas 1 0.9 0.8 0.7 0.5]
        [--splits test_synthesiser validation] [--limit 100] [--search greedy]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from asr.data import load_manifest, read_audio
from asr.transcription import recogniser, transcribe
from asr.wer import error_counts
from asr.whisper_encoder import WhisperEncoder, packaged_whisper_tiny_en


def interpolated(tuned: dict[str, torch.Tensor], pretrained: dict[str, torch.Tensor], alpha: float
                 ) -> dict[str, torch.Tensor]:
    """alpha x tuned + (1 - alpha) x pretrained for every floating-point tensor; the others as tuned."""
    return {name: torch.lerp(pretrained[name].to(value.dtype), value, alpha) if value.is_floating_point() else value
            for name, value in tuned.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default="asr-transducer-whisper-tiny")
    parser.add_argument("--corpus", type=Path, required=True, help="a corpus folder (SPLIT.jsonl manifests)")
    parser.add_argument("--alphas", type=float, nargs="+", default=[1.0, 0.9, 0.8, 0.7, 0.5])
    parser.add_argument("--splits", nargs="+", default=["test_synthesiser", "validation"])
    parser.add_argument("--limit", type=int, default=100, help="utterances per split")
    parser.add_argument("--search", choices=["greedy", "lm"], default="greedy",
                        help="greedy search, or the model's own beam search with its language model")
    args = parser.parse_args()
    found = recogniser(args.model)
    if found.model.config.encoder_kind != "whisper":
        raise ValueError(f"{args.model} has a {found.model.config.encoder_kind} encoder; this moves a Whisper encoder")
    tuned = {name: value.clone() for name, value in found.model.encoder.state_dict().items()}
    pretrained = WhisperEncoder.from_ctranslate2(packaged_whisper_tiny_en()).state_dict()
    sets = {}
    for split in args.splits:
        rows = list(load_manifest(args.corpus / f"{split}.jsonl"))[: args.limit]
        sets[split] = ([read_audio(row["audio"], found.features.sample_rate) for row in rows], [row["text"] for row in rows])
    search = (dict(method="greedy") if args.search == "greedy" else
              dict(method="beam", beam=found.beam, language_model=found.language_model, lm_weight=found.lm_weight,
                   ilm_weight=found.ilm_weight))
    print(f"{args.model}, {args.search} search, {args.limit} utterances a split of {args.corpus.name}\n")
    print("| alpha | " + " | ".join(f"{split} WER" for split in args.splits) + " |")
    print("|---|" + "---|" * len(args.splits))
    for alpha in args.alphas:
        found.model.encoder.load_state_dict(interpolated(tuned, pretrained, alpha))
        rates = []
        for waveforms, references in sets.values():
            hypotheses = transcribe(found.model, waveforms, found.tokenizer, found.features, **search)
            rates.append(error_counts(references, hypotheses).rate)
        print(f"| {alpha:g} | " + " | ".join(f"{rate:.3f}" for rate in rates) + " |", flush=True)


if __name__ == "__main__":
    main()
