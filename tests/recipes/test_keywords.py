"""The keywords recipe on two ranks through `zoo train`, and the shipped `kws-digits` spotter: its
accuracy on the FSDD speaker it never heard, its run under partial execution, and `zoo spot`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
import torch

import zoo
from asr.keywords import normalise_per_clip
from asr.spotting import spot_files
from asr.spoken_digits import DIGIT_WORDS, fsdd_mfccs
from recipes.keywords import KeywordClips, KeywordsConfig, partial_execution, predictions
from zoo.store import read_config

ZOO = str(Path(sys.executable).parent / "zoo")
SHIPPED = "kws-digits"
WAVS = [resources.files("asr").joinpath("assets", "fsdd", f"{digit}_theo_0.wav") for digit in range(10)]


@pytest.mark.ranks
@pytest.mark.timeout(600)
def test_two_ranks_zero2_train_writes_a_spotter_that_runs_under_partial_execution(tmp_path):
    command = [ZOO, "train", "keywords", "--nproc", "2", "--strategy.zero", "2", "--held_out", "george,lucas",
               "--espeak_voices", "1", "--flite_speeds", "150", "--train.max_steps", "3",
               "--train.global_batch_size", "16", "--train.micro_batch_size", "8", "--train.eval_every", "3",
               "--train.eval_batches", "1", "--train.progress", "false",
               "--train.output_dir", str(tmp_path / "run"), "--output", str(tmp_path / "model")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=580,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    metrics = config["metrics"]
    assert config["arch"] == "keyword-spotter" and config["labels"] == list(DIGIT_WORDS)
    assert metrics["held_out"] == ["george", "lucas"] and metrics["sizes"]["test"] == 1000
    assert metrics["sizes"]["train"] + metrics["sizes"]["validation"] == 2000 + 10 + 4 * 10  # FSDD, espeak, flite
    assert set(metrics["test_accuracy_by"]["speaker"]) == {"george", "lucas"}
    pex = metrics["partial_execution"]
    assert pex["arena_bytes"] == pex["peak_bytes"] <= pex["baseline_bytes"] and pex["same_predictions"]
    assert pex["row_stream_same_predictions"] and pex["row_stream_bytes"] <= pex["baseline_bytes"] / 4
    spotted = spot_files(tmp_path / "model", WAVS[:2], top_k=10)
    assert all(sorted(s.labels) == sorted(DIGIT_WORDS) and abs(sum(s.probabilities) - 1) < 1e-5 for s in spotted)


def test_held_out_must_name_fsdd_speakers():
    with pytest.raises(ValueError, match="held_out must name 1 to 5 of FSDD's speakers"):
        KeywordsConfig(held_out=("bob",))
    with pytest.raises(ValueError, match="held_out must name"):
        KeywordsConfig(held_out=())


def test_shipped_spotter_hears_the_held_out_speaker():
    config = read_config(SHIPPED)
    held_out = config["metrics"]["held_out"]
    fsdd = fsdd_mfccs()
    test = fsdd.select(torch.tensor([speaker in held_out for speaker in fsdd.speakers]))
    model = zoo.load(SHIPPED)
    clips = KeywordClips(test)
    predicted = predictions(model, clips)
    accuracy = (predicted == test.digits).float().mean().item()
    assert accuracy >= 0.9 and accuracy == pytest.approx(config["metrics"]["test_accuracy"], abs=1e-6)
    pex = partial_execution(model, clips)
    assert pex["same_predictions"] and pex["arena_bytes"] == config["metrics"]["partial_execution"]["arena_bytes"]
    # a row at a time: the input (1,960 B), ten rows of 64 x 5 floats, the pooled 64 and the 10 logits
    assert pex["row_stream_same_predictions"] and pex["row_stream_bytes"] == 1960 + 10 * 1280 + 4 * 64 + 4 * 10
    assert pex["baseline_bytes"] >= 4 * pex["row_stream_bytes"]
    assert torch.equal(clips.features, normalise_per_clip(test.features))


def test_zoo_spot_names_the_digits_of_recordings():
    result = subprocess.run([ZOO, "spot", SHIPPED, *map(str, WAVS), "--top", "1"], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    heard = [line.split(": ")[1].split()[0] for line in result.stdout.splitlines()]
    model = zoo.load(SHIPPED)
    assert heard == [DIGIT_WORDS[i] for i in predictions(model, KeywordClips(_shipped_wavs())).tolist()]
    assert sum(word == DIGIT_WORDS[digit] for digit, word in enumerate(heard)) >= 9


def test_zoo_spot_refuses_a_model_that_is_no_spotter():
    with pytest.raises(ValueError, match="is not a keyword spotter"):
        spot_files("vit-digits", WAVS[:1])


def _shipped_wavs():
    from asr.keywords import keyword_mfccs
    from asr.spoken_digits import SpokenDigits, fsdd_clip

    return SpokenDigits(torch.stack([keyword_mfccs(fsdd_clip(path)) for path in WAVS]), torch.arange(10), ("theo",) * 10,
                        tuple(f"{digit}_theo_0" for digit in range(10)))
