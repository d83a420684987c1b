"""The OPUS-MT Chinese -> English translator imported from its CTranslate2 package against CTranslate2
itself, on the first 200 inputs of `nlp.translation.opus_zh_en.example_sources` (real Chinese
aircraft-defect reports) or, with `--inputs catalogues`, on 200 Chinese messages of gcc's and git's
Debian catalogues with their English originals as references (drawn with seed 0): how many
translations are token for token CTranslate2's, greedy and with 4 beams, the seconds each takes
(both fp32 on this CPU, one thread each; batches of 25; the two timed in turns, medians of
--repeats) and, with references, both sides' sacrebleu BLEU and chrF.

    python benchmarks/opus_zh_en.py [--count 200] [--repeats 1] [--inputs example|catalogues]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BATCH = 25


def main() -> None:
    import ctranslate2
    import sentencepiece
    import torch

    from nlp.translation.ctranslate2_import import read_vocabulary, translator_from_ctranslate2
    from nlp.translation.decode import BeamSettings
    from nlp.translation.opus_zh_en import example_sources, model_directory
    from nlp.translation.tokenizer import detokenize

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--inputs", choices=("example", "catalogues"), default="example")
    args = parser.parse_args()
    torch.set_num_threads(1)
    directory = model_directory()
    model, vocabulary = translator_from_ctranslate2(directory / "model"), read_vocabulary(directory / "model")
    pieces = sentencepiece.SentencePieceProcessor(model_file=str(directory / "sentencepiece.model"))
    peer = ctranslate2.Translator(str(directory / "model"), device="cpu", compute_type="float32", intra_threads=1)
    references = None
    if args.inputs == "catalogues":
        from recipes.translation import programs_pairs, shuffled

        pairs = shuffled(programs_pairs(("gcc", "git"), "zh_CN", reverse=True), 0)[:args.count]
        sources, references = [s for s, _ in pairs], [r for _, r in pairs]
    else:
        sources = example_sources()[:args.count]
    tokenized = [pieces.encode(source, out_type=str) for source in sources]

    def theirs(beams: int) -> list[list[str]]:
        return [r.hypotheses[0] for r in peer.translate_batch(tokenized, beam_size=beams, max_batch_size=BATCH,
                                                              max_decoding_length=256)]

    def ours(beams: int) -> list[list[str]]:
        found = []
        for start in range(0, len(tokenized), BATCH):
            ids = [vocabulary.ids(tokens + [vocabulary.eos]) for tokens in tokenized[start:start + BATCH]]
            length = max(map(len, ids))
            source = torch.tensor([row + [model.config.eos_token_id] * (length - len(row)) for row in ids])
            mask = torch.tensor([[1] * len(row) + [0] * (length - len(row)) for row in ids])
            for row in model.generate(source, mask, BeamSettings(beams=beams, max_length_ratio=8.0, min_length=64)):
                found.append(vocabulary.pieces([t for t in row if t != model.config.eos_token_id]))
        return found

    print(f"{len(sources)} inputs, {sum(map(len, tokenized)):,} source pieces")
    print("| beams | token for token equal | memzoo s (median) | CTranslate2 s | ratio |")
    print("|---|---|---|---|---|")
    for beams in (1, 4):
        times: dict[str, list[float]] = {"ours": [], "theirs": []}
        outputs = {}
        for _ in range(args.repeats):
            for name, run in (("ours", ours), ("theirs", theirs)):
                started = time.perf_counter()
                outputs[name] = run(beams)
                times[name].append(time.perf_counter() - started)
        same = sum(a == b for a, b in zip(outputs["ours"], outputs["theirs"]))
        mine, peer_s = statistics.median(times["ours"]), statistics.median(times["theirs"])
        print(f"| {beams} | {same} / {len(sources)} | {mine:.1f} | {peer_s:.1f} | {mine / peer_s:.1f}x |", flush=True)
        if references is not None:
            import sacrebleu

            for name, found in outputs.items():
                texts = [detokenize(out) for out in found]
                print(f"|   | {name}: BLEU {sacrebleu.corpus_bleu(texts, [references]).score:.2f}, "
                      f"chrF {sacrebleu.corpus_chrf(texts, [references]).score:.2f} | | | |", flush=True)
    print("first translations:", *(f"{source} -> {detokenize(out)}" for source, out in zip(sources, outputs["ours"][:3])),
          sep="\n  ")


if __name__ == "__main__":
    main()
