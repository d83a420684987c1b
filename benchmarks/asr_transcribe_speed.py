"""Real-time factor of `zoo transcribe`: seconds of computing per second of audio, for a 10 s
recording of held-out sentences (espeak-ng, training voices, 0.3 s pauses), greedy and beam
search (the first pass alone, and with the model's own second pass if it has one), with the
models' own decoding settings; and a 10-minute recording (the 10 s one 60 times), cut into
segments (`asr.segmentation`), greedy and with the model's own decoding (what `zoo transcribe
MODEL FILE` runs), with the peak RSS of a fresh process.

    python benchmarks/asr_transcribe_speed.py [MODEL ...] [--threads 2] [--repeats 3]

MODEL: zoo names or folders of speech recognisers (default: asr-transducer-tiny). Each model runs
in a fresh process (`--one` is that process's entry), so that the peak RSS is its own.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def recording(seconds: float, folder: Path) -> torch.Tensor:
    """(N,) 16 kHz held-out sentences spoken one after another with 0.3 s pauses, cut to `seconds`."""
    from asr.data import CorpusConfig, read_audio, split_sentences
    from asr.voices import speak, voices

    sentences = split_sentences(CorpusConfig())[2]
    pieces, total = [], 0
    for index, (text, voice) in enumerate(zip(sentences, voices("none", len(sentences), random.Random(0)))):
        path = folder / f"{index}.wav"
        speak(text, voice, path)
        pieces += [read_audio(path, 16000), torch.zeros(4800)]
        total += pieces[-2].numel() + 4800
        if total >= seconds * 16000:
            break
    return torch.cat(pieces)[: int(seconds * 16000)]


def one(model: str, threads: int, repeats: int) -> dict:
    """Timings of one model in this process: {"greedy_rtf", "first_pass_rtf" (beam search alone),
    "beam_rtf" (with the model's second pass; None without one), "long_rtf" (greedy),
    "long_default_rtf" (the model's own decoding), "peak_rss_mib"}."""
    from asr.transcription import recogniser, transcribe
    from asr.whisper_rescoring import Rescoring

    torch.set_num_threads(threads)
    found = recogniser(model)
    with tempfile.TemporaryDirectory() as folder:
        ten = recording(10.0, Path(folder))

    def decode(audio: torch.Tensor, method: str, rescoring: Rescoring | None) -> None:
        transcribe(found.model, [audio], found.tokenizer, found.features, method=method, beam=found.beam,
                   language_model=found.language_model, lm_weight=found.lm_weight, ilm_weight=found.ilm_weight,
                   rescoring=rescoring)

    results = {"beam_rtf": None}
    runs = [("greedy", "greedy", None), ("first_pass", "beam", Rescoring())]
    for name, method, rescoring in runs + [("beam", "beam", found.rescoring)] * (found.rescoring.weight > 0):
        for timed in (False, True):  # the first call loads what it needs
            started = time.perf_counter()
            for _ in range(repeats if timed else 1):
                decode(ten, method, rescoring)
        results[f"{name}_rtf"] = (time.perf_counter() - started) / repeats / 10.0
    for name, method in (("long", "greedy"), ("long_default", "beam")):
        started = time.perf_counter()
        decode(ten.repeat(60), method, found.rescoring)
        results[f"{name}_rtf"] = (time.perf_counter() - started) / 600.0
    results["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="*", default=["asr-transducer-tiny"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.models[0], args.threads, args.repeats)))
        return
    print(f"threads {args.threads}, {args.repeats} repeats of a 10 s recording; 10 minutes once\n")
    print("| model | RTF greedy (10 s) | RTF beam (10 s) | RTF beam + second pass (10 s) | RTF greedy (10 min, "
          "segmented) | RTF its decoding (10 min, segmented) | peak RSS MiB |\n|---|---|---|---|---|---|---|")
    for model in args.models:
        done = subprocess.run([sys.executable, __file__, model, "--one", "--threads", str(args.threads), "--repeats",
                               str(args.repeats)], capture_output=True, text=True, check=True)
        r = json.loads(done.stdout.splitlines()[-1])
        second = "(none)" if r["beam_rtf"] is None else f"{r['beam_rtf']:.4f}"
        print(f"| {model} | {r['greedy_rtf']:.4f} | {r['first_pass_rtf']:.4f} | {second} | {r['long_rtf']:.4f} "
              f"| {r['long_default_rtf']:.4f} | {r['peak_rss_mib']:,.0f} |")


if __name__ == "__main__":
    main()
