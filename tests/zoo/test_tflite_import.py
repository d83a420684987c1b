"""MLPerf Tiny's keyword spotter (DS-CNN) and person detector (MobileNetV1-0.25, 96 x 96) read from
their .tflite files (`zoo.tflite`) against the TensorFlow Lite interpreter (`ai_edge_litert`) on
real inputs: OpenCV's photographs and the MFCCs of recorded speech."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch

import zoo
from asr.data import read_audio, recorded_speech
from asr.keywords import CLIP_SAMPLES, SAMPLE_RATE, keyword_mfccs
from vision.photos import PHOTOS, opencv_photos
from zoo.downloads import data_dir, pip_wheel
from zoo.nn.conv import Conv2dSame
from zoo.parity import relative_error
from zoo.partial import activation_buffers, plan_arena, schedule
from zoo.store import locate
from zoo.tflite import file_arena, interpreter_outputs, read_tflite, read_tflite_graph

KWS, VWW = "kws-dscnn-mlperf-tiny", "vww-mobilenet-v1-0.25-mlperf-tiny"


@pytest.fixture(scope="module")
def photos() -> torch.Tensor:
    return opencv_photos(96).float() / 255


@pytest.fixture(scope="module")
def speech() -> torch.Tensor:
    """MFCCs (N, 1, 49, 10) of each second of the recorded sentences and card names."""
    features = []
    for row in recorded_speech():
        waveform = read_audio(row["audio"], SAMPLE_RATE)
        for start in range(0, waveform.shape[0] - CLIP_SAMPLES + 1, CLIP_SAMPLES):
            features.append(keyword_mfccs(waveform[start : start + CLIP_SAMPLES]))
    return torch.stack(features)


def test_the_person_detector_is_the_interpreter_s_on_photographs(photos):
    folder = locate(VWW)
    model = read_tflite(folder / "model.tflite")
    assert model.input_shape == (1, 3, 96, 96) and model.input_quantization is None
    assert sum(isinstance(m, Conv2dSame) for m in model.module) == 5  # the stride-2 layers pad 0 before, 1 after
    expected, found = interpreter_outputs(folder / "model.tflite", model, photos), model.outputs(photos)
    assert relative_error(found, expected) < 1e-5
    person = dict(zip(PHOTOS, found[:, 1].tolist()))
    assert person["messi5.jpg"] > 0.8 and max(person[name] for name in ("apple.jpg", "orange.jpg", "board.jpg")) < 0.05
    assert isinstance(zoo.load(VWW), torch.nn.Sequential)


def test_zoo_classify_reads_photographs_with_the_person_detector(tmp_path):
    from PIL import Image

    from vision.classify import classify_files

    photos = opencv_photos(96)
    paths = []
    for name in ("messi5.jpg", "orange.jpg"):
        paths.append(tmp_path / f"{name}.png")
        Image.fromarray(photos[PHOTOS.index(name)].permute(1, 2, 0).numpy()).save(paths[-1])
    person, orange = classify_files(VWW, paths, top_k=2)
    assert person.labels == ("person", "no person") and person.probabilities[0] > 0.8
    assert orange.labels[0] == "no person" and sum(orange.probabilities) == pytest.approx(1.0)


def test_the_int8_person_detector_dequantised_keeps_the_interpreter_s_choices(photos):
    folder = locate(VWW)
    model = read_tflite(folder / "model-int8.tflite")
    assert model.input_quantization.scale == pytest.approx(1 / 255) and model.input_quantization.zero_point == -128
    expected, found = interpreter_outputs(folder / "model-int8.tflite", model, photos), model.outputs(photos)
    assert (found.argmax(1) == expected.argmax(1)).all()
    assert (found - expected).abs().max() < 0.05  # the int8 interpreter requantises every layer's output


def test_the_keyword_spotter_on_recorded_speech(speech):
    """The "float32" file holds its pointwise convolutions' weights in int8 (a hybrid model): the
    interpreter quantises their inputs on the fly, ours runs them in float32 on the same weights."""
    folder = locate(KWS)
    assert speech.shape[0] >= 20
    for name, closeness in (("model.tflite", 0.1), ("model-int8.tflite", 0.2)):
        model = read_tflite(folder / name)
        assert model.input_shape == (1, 1, 49, 10)
        expected, found = interpreter_outputs(folder / name, model, speech), model.outputs(speech)
        agreement = (found.argmax(1) == expected.argmax(1)).float().mean().item()
        assert agreement >= 0.9, (name, agreement)
        assert (found - expected).abs().max() < closeness, name


def test_partial_execution_of_the_imported_models(photos, speech):
    """The sequential arena reaches the most bytes alive at one operator (activations in place, as
    the interpreter fuses them): the person detector's first pointwise convolution's input and output;
    Pex's schedule gives the module's outputs in its input beside the first convolution's output. The
    keyword spotter's layers are all 64 x 25 x 5: between two pointwise convolutions a whole map is
    always alive beside another, so no channel split lowers its arena."""
    for name, x, baseline, peak in ((VWW, photos[:1], (8 + 16) * 48 * 48 * 4, (3 * 96 * 96 + 8 * 48 * 48) * 4),
                                    (KWS, speech[:1], 2 * 64 * 25 * 5 * 4, 2 * 64 * 25 * 5 * 4)):
        model = read_tflite(locate(name) / "model.tflite")
        arena = plan_arena(activation_buffers(model.module, x))
        plan = schedule(model.module, x)
        assert arena.arena_bytes == arena.lower_bound == plan.baseline_bytes == baseline, name
        assert plan.peak_bytes == peak, name
        with torch.no_grad():
            assert relative_error(plan(x.clone()), model.module(x.clone())) < 1e-6, name


def test_the_file_s_own_arena_and_tensorflow_lite_micro_s_figure(tmp_path, photos, speech):
    """`file_arena` plans the file's own tensors in its element sizes: the int8 files' arenas are the
    float modules' traced plans at one byte a value, and okay_nabu's (a streaming wake-word model,
    its state variables beside) is within the arena its configuration gives TensorFlow Lite Micro."""
    for name, x in ((VWW, photos[:1]), (KWS, speech[:1])):
        module = read_tflite(locate(name) / "model.tflite").module
        assert file_arena(locate(name) / "model-int8.tflite").plan.arena_bytes == \
            plan_arena(activation_buffers(module, x)).arena_bytes // 4
    wheel = pip_wheel("pymicro-wakeword==2.5.0", data_dir())
    with zipfile.ZipFile(wheel) as archive:
        (tmp_path / "okay_nabu.tflite").write_bytes(archive.read("pymicro_wakeword/models/okay_nabu.tflite"))
        configured = json.loads(archive.read("pymicro_wakeword/models/okay_nabu.json"))["micro"]["tensor_arena_size"]
    arena = file_arena(tmp_path / "okay_nabu.tflite")
    assert configured == 37_000
    assert arena.variable_bytes == (2 * 40 + (2 + 8 + 12 + 14 + 16) * 64)  # the six streaming buffers, int8
    assert arena.plan.lower_bound <= arena.plan.arena_bytes and arena.plan.arena_bytes + arena.variable_bytes <= configured
    for a in arena.plan.buffers:
        for b in arena.plan.buffers:
            if a.name < b.name and a.meets(b):
                start_a, start_b = arena.plan.offsets[a.name], arena.plan.offsets[b.name]
                assert start_a + a.nbytes <= start_b or start_b + b.nbytes <= start_a, (a, b)


def micro_features(waveform: torch.Tensor) -> torch.Tensor:
    """pymicro-wakeword's features of 16 kHz samples: (frames, 40), one every 10 ms (its MicroFrontend)."""
    from pymicro_features import MicroFrontend

    frontend, pcm, frames, start = MicroFrontend(), (waveform.clamp(-1, 1) * 32767).to(torch.int16).numpy().tobytes(), [], 0
    while start + 320 <= len(pcm):
        made = frontend.process_samples(pcm[start : start + 320])
        start += 2 * made.samples_read
        if made.features:
            frames.append(made.features)
    return torch.tensor(frames, dtype=torch.float32)


def test_a_streaming_wake_word_model_follows_the_interpreter_step_by_step(tmp_path):
    """okay_nabu (int8, state variables between calls) read as a graph: over spoken "okay nabu"s
    (espeak-ng, three voices) and recorded sentences, 3 feature frames a call as pymicro-wakeword
    feeds it, its probabilities follow the interpreter's and it wakes on the same clips (two of the
    three voices; none of the sentences)."""
    from ai_edge_litert.interpreter import Interpreter

    wheel = pip_wheel("pymicro-wakeword==2.5.0", data_dir())
    path = tmp_path / "okay_nabu.tflite"
    with zipfile.ZipFile(wheel) as archive:
        path.write_bytes(archive.read("pymicro_wakeword/models/okay_nabu.tflite"))
    clips = {}
    for voice in ("en-us", "en-gb", "en-us+f3"):
        subprocess.run(["espeak-ng", "-v", voice, "-w", str(tmp_path / "wake.wav"), "okay nabu"], check=True)
        clips[voice] = torch.cat([read_audio(tmp_path / "wake.wav", SAMPLE_RATE), torch.zeros(SAMPLE_RATE // 2)])
    for row in recorded_speech()[:3]:
        clips[Path(row["audio"]).stem] = read_audio(row["audio"], SAMPLE_RATE)
    model = read_tflite_graph(path)
    assert model.input_shape == (1, 3, 40) and len(model.state_dict()) == 6
    peaks, differences = {}, []
    for name, waveform in clips.items():
        model.reset()
        interpreter = Interpreter(model_path=str(path))  # its variables as the file initialises them
        interpreter.allocate_tensors()
        (given,), (made,) = interpreter.get_input_details(), interpreter.get_output_details()
        features, ours, theirs = micro_features(waveform), [], []
        for start in range(0, features.shape[0] - 2, 3):
            quantised = model.input_quantization.quantize(features[None, start : start + 3])
            interpreter.set_tensor(given["index"], quantised.numpy())
            interpreter.invoke()
            theirs.append(float(interpreter.get_tensor(made["index"]).item()) * model.output_quantization.scale)
            ours.append(model(model.input_quantization.dequantize(quantised)).item())
        differences += [abs(a - b) for a, b in zip(ours, theirs)]
        peaks[name] = (max(ours), max(theirs))
    assert max(differences) < 0.1 and sum(differences) / len(differences) < 0.005
    for name, (ours, theirs) in peaks.items():  # 0.85: the model's own cut-off (okay_nabu.json)
        assert (ours > 0.85) == (theirs > 0.85), (name, ours, theirs)
        assert abs(ours - theirs) < 0.02, (name, ours, theirs)
    assert peaks["en-us"][0] > 0.85 and peaks["en-gb"][0] > 0.85  # the two male voices wake it
    assert max(ours for name, (ours, _) in peaks.items() if not name.startswith("en-")) < 0.1  # read sentences do not


def test_what_it_cannot_read_is_named(tmp_path):
    wheel = pip_wheel("pymicro-wakeword==2.5.0", data_dir())
    with zipfile.ZipFile(wheel) as archive:
        (tmp_path / "okay_nabu.tflite").write_bytes(archive.read("pymicro_wakeword/models/okay_nabu.tflite"))
    with pytest.raises(ValueError, match="reads a model of one subgraph; this one has 2"):
        read_tflite(tmp_path / "okay_nabu.tflite")
