"""MLPerf Tiny's keyword spotter and person detector read from .tflite (`zoo.tflite`) against the
TensorFlow Lite interpreter on real inputs, and their activation arenas unsplit and under partial
execution (`zoo.partial`).

    python benchmarks/tflite_models.py

Inputs: the 16 photographs of `vision.photos` (96 x 96) for the person detector; `asr.keywords`
MFCCs of each whole second of Debian pocketsphinx-testdata's recordings for the keyword spotter.
Per file: how often our top class is the interpreter's, the largest difference of an output
probability and the outputs' relative error. Arenas in float32 bytes (ours runs float32), the
input included; each executor's arena (`zoo.partial.executor`: the unsplit chain, the schedule;
`zoo.partial.stream`: the chain a row at a time, where it streams) with what the CPU allocator handed
out while it ran one input (torch's profiler); multiply-accumulates of one input. Last, the int8 files'
own tensors planned in one byte a value (`zoo.tflite.file_arena`), and pymicro-wakeword's four
streaming models beside the arena their configurations give TensorFlow Lite Micro.
"""

from __future__ import annotations

import json
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WAKE_WORDS = "pymicro-wakeword==2.5.0"
"""The wheel whose streaming wake-word models (int8, with their TensorFlow Lite Micro arena sizes) are planned."""


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
    import torch
    from torch.profiler import ProfilerActivity, profile

    from vision.photos import opencv_photos
    from zoo.parity import relative_error
    from zoo.partial import schedule, stream
    from zoo.partial.executor import ArenaExecutor, ScheduleExecutor
    from zoo.store import locate
    from zoo.downloads import data_dir, pip_wheel
    from zoo.tflite import file_arena, interpreter_outputs, read_tflite

    inputs = {"vww-mobilenet-v1-0.25-mlperf-tiny": opencv_photos(96).float() / 255,
              "kws-dscnn-mlperf-tiny": speech_features()}
    print("| model | file | inputs | top-1 agreement | largest probability difference | relative error |")
    print("|---|---|---|---|---|---|")
    arenas, refusals = [], []
    for name, x in inputs.items():
        for file in ("model.tflite", "model-int8.tflite"):
            path = locate(name) / file
            model = read_tflite(path)
            theirs, ours = interpreter_outputs(path, model, x), model.outputs(x)
            agreement = (theirs.argmax(1) == ours.argmax(1)).sum().item()
            print(f"| {name} | {file} | {len(x)} | {agreement} / {len(x)} | {(theirs - ours).abs().max():.2e} | "
                  f"{relative_error(ours, theirs):.2e} |")
        plan = schedule(model.module, x[:1])
        executors = ArenaExecutor(model.module, x[:1]), ScheduleExecutor(plan, x[:1])
        ran = []
        for executor in executors:
            executor.run(x[:1])
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as recorded:
                executor.run(x[:1])
            allocated = sum(max(event.self_cpu_memory_usage, 0) for event in recorded.key_averages())
            ran.append(f"{executor.arena.numel():,} B, {allocated} B more")
        try:
            rows = stream(model.module, x[:1])
            rows.run(x[:1])
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as recorded:
                rows.run(x[:1])
            allocated = sum(max(event.self_cpu_memory_usage, 0) for event in recorded.key_averages())
            with torch.no_grad():
                error = relative_error(stream(model.module, x).run(x), model.module(x))
            streamed = (f"{rows.peak_bytes:,} B, {allocated} B more, {plan.baseline_bytes / rows.peak_bytes:.2f}x less; "
                        f"relative error {error:.1e} over the {len(x)} inputs")
        except ValueError as refused:
            streamed = "-"
            refusals.append(f"{name}: {refused}")
        arenas.append(f"| {name} | {plan.baseline_bytes:,} | {ran[0]} | {plan.peak_bytes:,} | {ran[1]} | "
                      f"{plan.baseline_bytes / plan.peak_bytes:.2f}x | {streamed} | {plan.macs:,} |")
    print("\n| model | sequential arena B | its executor: arena, allocated while running | partial execution B | "
          "its executor | less | a row at a time: arena, allocated while running, less | MACs |"
          "\n|---|---|---|---|---|---|---|---|")
    print("\n".join(arenas))
    print("".join(f"\nnot streamed, {refusal}" for refusal in refusals))
    print("\n| file | activation arena B (bound) | state variables B | together | TensorFlow Lite Micro's configured arena B |"
          "\n|---|---|---|---|---|")
    for name in inputs:
        found = file_arena(locate(name) / "model-int8.tflite")
        print(f"| {name} int8 | {found.plan.arena_bytes:,} ({found.plan.lower_bound:,}) | 0 | {found.plan.arena_bytes:,} | |")
    with zipfile.ZipFile(pip_wheel(WAKE_WORDS, data_dir())) as archive, tempfile.TemporaryDirectory() as folder:
        for word in ("okay_nabu", "hey_jarvis", "alexa", "hey_mycroft"):
            path = Path(folder) / f"{word}.tflite"
            path.write_bytes(archive.read(f"pymicro_wakeword/models/{word}.tflite"))
            configured = json.loads(archive.read(f"pymicro_wakeword/models/{word}.json"))["micro"]["tensor_arena_size"]
            found = file_arena(path)
            print(f"| {WAKE_WORDS} {word} | {found.plan.arena_bytes:,} ({found.plan.lower_bound:,}) | "
                  f"{found.variable_bytes:,} | {found.plan.arena_bytes + found.variable_bytes:,} | {configured:,} |")


if __name__ == "__main__":
    main()
