"""The vit_digits recipe on two ranks through `zoo train`, and the shipped `vit-digits` model: its
accuracy on real digits and `zoo classify` on image files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

import zoo
from recipes.vit_digits import ViTDigitsConfig, evenly_spaced
from vision.classify import accuracy, classify_files
from vision.digits import frame_like_mnist, opencv_digits
from vision.preprocess import ImageProcessor, LabelledImages
from vision.vit import ViT
from zoo.store import read_config

ZOO = str(Path(sys.executable).parent / "zoo")


@pytest.mark.ranks
@pytest.mark.timeout(600)
def test_two_ranks_zero2_fine_tune_writes_a_loadable_classifier(tmp_path):
    command = [ZOO, "train", "vit_digits", "--nproc", "2", "--strategy.zero", "2", "--layers", "2",
               "--train.max_steps", "3", "--train.global_batch_size", "8", "--train.micro_batch_size", "4",
               "--train.eval_every", "3", "--train.eval_batches", "2", "--train.progress", "false",
               "--accuracy_examples", "30", "--save_dtype", "bfloat16",
               "--train.output_dir", str(tmp_path / "run"), "--output", str(tmp_path / "model")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=580,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    assert "OpenCV digits (never trained on)" in result.stdout
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["arch"] == "vit" and config["config"]["num_hidden_layers"] == 2 and config["labels"][3] == "3"
    assert config["metrics"]["sizes"] == {"train": 7499, "validation": 501, "test": 2000, "opencv": 5000}
    assert config["metrics"]["accuracy_examples"] == {"validation": 30, "test": 30, "opencv": 30}
    assert all(0.0 <= config["metrics"][f"{s}_accuracy"] <= 1.0 for s in ("validation", "test", "opencv"))
    model = zoo.load(tmp_path / "model")
    assert isinstance(model, ViT) and model.embeddings.patch.weight.shape == (384, 1, 14, 14)
    card = (tmp_path / "model" / "README.md").read_text()
    assert all(f" {words} " in card for words in ("--nproc 2", "--strategy.zero 2", "--layers 2"))


def test_evenly_spaced_subsets_reach_every_class():
    assert evenly_spaced(5, None) == [0, 1, 2, 3, 4] and evenly_spaced(5, 9) == [0, 1, 2, 3, 4]
    assert evenly_spaced(5000, 20)[:3] == [0, 263, 526] and evenly_spaced(5000, 20)[-1] == 4999
    assert opencv_digits().labels[evenly_spaced(5000, 20)].unique().numel() == 10
    with pytest.raises(ValueError, match="image_size must be a positive multiple of the patch size 14; got 50"):
        ViTDigitsConfig(image_size=50)


def test_shipped_vit_digits_classifies_opencv_digits_it_never_saw():
    config = read_config("vit-digits")
    assert config["metrics"]["test_accuracy"] >= 0.97  # what the recipe measured on the 2,000 held-out MNIST digits
    processor = ImageProcessor(**config["image_processor"])
    opencv = opencv_digits()
    chosen = evenly_spaced(len(opencv), 500)
    examples = LabelledImages(frame_like_mnist(opencv.images[chosen]), opencv.labels[chosen], processor)
    assert accuracy(zoo.load("vit-digits"), examples, processor) >= 0.96


def test_zoo_classify_prints_labels_and_probabilities_of_image_files(tmp_path):
    opencv = opencv_digits()
    paths = []
    for digit in range(10):
        image = opencv.images[digit * 500 + 7]
        if digit % 2:  # dark ink on white paper, scaled up: the processor inverts and frames it
            image = (255 - image).repeat_interleave(4, 0).repeat_interleave(4, 1)
        paths.append(tmp_path / f"digit_{digit}.png")
        Image.fromarray(image.numpy()).save(paths[-1])
    result = subprocess.run([ZOO, "classify", "vit-digits", *map(str, paths), "--top", "2"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 10 and lines[0].startswith(f"{paths[0]}: ")
    predicted = [line.split(": ")[1].split() for line in lines]
    assert all(len(words) == 4 and float(words[1]) >= float(words[3]) for words in predicted)
    assert sum(words[0] == str(digit) for digit, words in enumerate(predicted)) >= 9
    top = classify_files("vit-digits", paths[:1], top_k=10)[0]
    assert sorted(top.labels) == [str(d) for d in range(10)] and abs(sum(top.probabilities) - 1) < 1e-5


def test_classify_refuses_a_model_that_is_no_image_classifier():
    with pytest.raises(ValueError, match="'gpt-shakespeare-char' is not an image classifier"):
        classify_files("gpt-shakespeare-char", ["x.png"])
