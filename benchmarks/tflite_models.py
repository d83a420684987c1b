"""MLPerf Tiny's keyword spotter and person detector read from .tflite (`zoo.tflite_io`) against the
TensorFlow Lite interpreter on real inputs, and their activation arenas unsplit and under partial
execution (`zoo.partial`).

    python benchmarks/tflite_models.py

Inputs: the 16 photographs of `vision.photos` (96 x 96) for the person detector; `asr.keywords`
MFCCs of each whole second of Debian pocketsphinx-testdata's recordings for the keyword spotter.
Per file: how often our top class is the interpreter's, the largest difference of an output
probability and the outputs' relative error. Arenas in float32 bytes (ours runs float32), the
input included; the executor's (`zoo.partial.executor`) with what the CPU allocator handed out
while it ran one input (torch's profiler); multiply-accumulates of one input.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def speech_features():
    import torch

    from asr.data import read_audio, recorded_speech
    from asr.keywords import CLIP_SAMPLES, SAMPLE_RATE, keyword_mfccs

    clips = []
    for row in recorded_speech():
        waveform = read_audio(row["audio"], SAMPLE_RATE)
        clips += [keyword_mfccs(waveform[start : start + CLIP_SAMPLES])
                  for start in range(0, waveform.shape[0] - CLIP_SAMPLES + 1, CLIP_SAMPLES)]
    return torch.stack(clips)


def main() -> None:
    from torch.profiler import ProfilerActivity, profile

    from vision.photos import opencv_photos
    from zoo.parity import relative_error
    from zoo.partial import schedule
    from zoo.partial.executor import ArenaExecutor
    from zoo.store import locate
    from zoo.tflite_io import interpreter_outputs, read_tflite

    inputs = {"vww-mobilenet-v1-0.25-mlperf-tiny": opencv_photos(96).float() / 255,
              "kws-dscnn-mlperf-tiny": speech_features()}
    print("| model | file | inputs | top-1 agreement | largest probability difference | relative error |")
    print("|---|---|---|---|---|---|")
    arenas = []
    for name, x in inputs.items():
        for file in ("model.tflite", "model-int8.tflite"):
            path = locate(name) / file
            model = read_tflite(path)
            theirs, ours = interpreter_outputs(path, model, x), model.outputs(x)
            agreement = (theirs.argmax(1) == ours.argmax(1)).sum().item()
            print(f"| {name} | {file} | {len(x)} | {agreement} / {len(x)} | {(theirs - ours).abs().max():.2e} | "
                  f"{relative_error(ours, theirs):.2e} |")
        plan, executor = schedule(model.module, x[:1]), ArenaExecutor(model.module, x[:1])
        executor.run(x[:1])
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as recorded:
            executor.run(x[:1])
        allocated = sum(max(event.self_cpu_memory_usage, 0) for event in recorded.key_averages())
        arenas.append(f"| {name} | {plan.baseline_bytes:,} | {executor.arena.numel():,} B, {allocated} B more | "
                      f"{plan.peak_bytes:,} | {plan.baseline_bytes / plan.peak_bytes:.2f}x | {plan.macs:,} |")
    print("\n| model | sequential arena B | executor: its arena, allocated while running | partial execution B | less "
          "| MACs |\n|---|---|---|---|---|---|")
    print("\n".join(arenas))


if __name__ == "__main__":
    main()
