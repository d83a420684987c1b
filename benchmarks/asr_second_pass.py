"""Where a recogniser's two-pass transcripts come from (`asr.whisper_rescoring`), set by set: the
first pass alone, both passes as the model ships them, Whisper tiny.en's own greedy transcript alone
(the peer, on the same clips in the same run), and how often the chosen text was the beam's best, another
hypothesis of its final beam, or Whisper's own transcript.

    python benchmarks/asr_second_pass.py [MODEL] [--limit 100] [--threads 2]

MODEL: a zoo name or folder of a recogniser with a second pass (default asr-transducer-whisper-tiny).
Sets: the held-out splits of the modern-English corpus that entries (a) and (b) were evaluated on
(Kokoro at 0.3, blends at 0.5), `limit` clips each, and the real recordings.
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch

from asr.data import CorpusConfig, build_corpus, load_manifest, read_audio, recorded_speech
from asr.transcription import recogniser, second_pass_candidates, segment_hypotheses, whisper_rescorer
from asr.wer import error_counts
from asr.whisper_rescoring import SAMPLE_RATE, best_rescored

SETS = ("validation", "validation_kokoro", "test_domain", "test_synthesiser", "test_voices", "test_accent")
RECORDED = ("librivox", "cards")
SOURCES = ("beam's best", "other hypothesis", "Whisper's transcript")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="asr-transducer-whisper-tiny")
    parser.add_argument("--limit", type=int, default=100, help="utterances of each synthetic set")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    found, rescorer = recogniser(args.model), whisper_rescorer()
    if not found.rescoring.weight:
        raise ValueError(f"model {args.model!r} has no second pass (its config's decoding.rescoring.weight is 0)")
    corpus = build_corpus(CorpusConfig(text="modern", kokoro_share=0.3, kokoro_blend_share=0.5))
    sets = {name: list(load_manifest(corpus / f"{name}.jsonl"))[: args.limit] for name in SETS}
    recorded = recorded_speech()
    sets |= {name: [row for row in recorded if row["set"] == name] for name in RECORDED}
    print(f"{args.model}: second pass {found.rescoring}; {args.threads} thread(s)\n")
    print("| set | utterances | WER first pass | WER both passes | WER Whisper alone | chosen: "
          + " / ".join(SOURCES) + " (segments) |\n|---|---|---|---|---|---|")
    for name, rows in sets.items():
        audio = [read_audio(row["audio"], found.features.sample_rate) for row in rows]
        finals = segment_hypotheses(found.model, audio, found.tokenizer, found.features, found.beam,
                                    language_model=found.language_model, lm_weight=found.lm_weight,
                                    ilm_weight=found.ilm_weight)
        first, both, alone, sources = [], [], [], Counter()
        for parts in finals:
            texts = {"first": [], "both": [], "alone": []}
            for segment in parts:
                candidates = second_pass_candidates(found, segment, found.rescoring.whisper_transcript)
                chosen = best_rescored(candidates, found.rescoring)
                beam = [text for text, _ in segment.hypotheses]
                sources[SOURCES[0] if chosen == beam[0] else SOURCES[1] if chosen in beam else SOURCES[2]] += 1
                texts["first"].append(beam[0])
                texts["both"].append(chosen)
                waveform = segment.waveform
                texts["alone"].append(rescorer.transcript(rescorer.memories(waveform), waveform.numel() / SAMPLE_RATE))
            first.append(" ".join(texts["first"]))
            both.append(" ".join(texts["both"]))
            alone.append(" ".join(texts["alone"]))
        references = [row["text"] for row in rows]
        rates = [f"{error_counts(references, hypotheses).rate:.4f}" for hypotheses in (first, both, alone)]
        print(f"| {name} | {len(rows)} | {' | '.join(rates)} | {' / '.join(str(sources[s]) for s in SOURCES)} |",
              flush=True)


if __name__ == "__main__":
    main()
