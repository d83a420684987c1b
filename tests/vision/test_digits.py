"""Digit data from the registries, deterministic splits, MNIST framing, augmentation and the
image processor."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from trainers import Strategy, TrainConfig, Trainer
from vision.augment import Augmentation, augment
from vision.classify import accuracy
from vision.digits import (MNIST_COUNTS, Digits, frame_like_mnist, mnist_digits, opencv_digits, sklearn_digits,
                           stratified_split)
from vision.preprocess import ClassificationCollate, ImageProcessor, LabelledImages
from vision.vit import ViT, ViTConfig


def test_the_three_digit_sets_load_with_their_published_sizes():
    mnist, opencv, sklearn = mnist_digits(), opencv_digits(), sklearn_digits()
    assert mnist.images.shape == (10000, 28, 28) and tuple(mnist.labels.bincount().tolist()) == MNIST_COUNTS
    assert opencv.images.shape == (5000, 20, 20) and opencv.labels.bincount().tolist() == [500] * 10
    assert sklearn.images.shape == (1797, 8, 8) and sklearn.labels.unique().tolist() == list(range(10))
    for digits in (mnist, opencv, sklearn):
        assert digits.images.dtype == torch.uint8 and digits.images.max() == 255
        assert digits.images.float().mean() < 0.35 * 255  # ink bright on a black background
    for digits in (mnist, opencv):  # the border is background, the middle carries the strokes
        border = torch.cat([digits.images[:, 0], digits.images[:, -1]], 1).float().mean()
        assert border < 0.1 * digits.images[:, 2:-2, 2:-2].float().mean()
    # MNIST's own framing: every digit's ink fits a 20x20 box, centred within a pixel or two.
    mass = mnist.images[:500].float()
    rows = (mass.sum(2) * torch.arange(28)).sum(1) / mass.sum((1, 2))
    assert (rows - 13.5).abs().max() < 2.0


def test_class_means_of_mnist_and_opencv_digits_agree_once_framed_alike():
    mnist, opencv = mnist_digits(), opencv_digits()
    framed = frame_like_mnist(opencv.images).float()
    means = torch.stack([mnist.images[mnist.labels == d].float().mean(0).flatten() for d in range(10)])
    theirs = torch.stack([framed[opencv.labels == d].mean(0).flatten() for d in range(10)])
    similarity = torch.nn.functional.normalize(theirs, dim=1) @ torch.nn.functional.normalize(means, dim=1).T
    assert similarity.argmax(1).tolist() == list(range(10))  # each OpenCV class looks most like its MNIST class


def test_stratified_split_is_deterministic_disjoint_and_per_class():
    labels = mnist_digits().labels
    split = stratified_split(labels, {"test": 0.2, "validation": 0.05}, seed=3)
    assert stratified_split(labels, {"test": 0.2, "validation": 0.05}, seed=3)["test"].equal(split["test"])
    assert not stratified_split(labels, {"test": 0.2, "validation": 0.05}, seed=4)["test"].equal(split["test"])
    every = torch.cat(list(split.values()))
    assert every.numel() == labels.numel() and every.unique().numel() == labels.numel()
    for digit, count in enumerate(MNIST_COUNTS):
        assert abs((labels[split["test"]] == digit).sum().item() - 0.2 * count) <= 0.5
    with pytest.raises(ValueError, match="fractions must be positive and sum to less than 1"):
        stratified_split(labels, {"test": 0.6, "validation": 0.5})


def test_frame_like_mnist_fits_the_ink_into_20_pixels_centred_by_mass():
    image = torch.zeros(1, 50, 30, dtype=torch.uint8)
    image[0, 5:45, 10:20] = 255  # a 40x10 bar far from the centre
    framed = frame_like_mnist(image)[0].float()
    ink = (framed > 25).nonzero()
    assert ink[:, 0].max() - ink[:, 0].min() + 1 == 20 and ink[:, 1].max() - ink[:, 1].min() + 1 in (5, 6)
    rows = (framed.sum(1) * torch.arange(28)).sum() / framed.sum()
    cols = (framed.sum(0) * torch.arange(28)).sum() / framed.sum()
    assert abs(rows - 13.5) <= 0.5 and abs(cols - 13.5) <= 0.5
    assert frame_like_mnist(torch.zeros(2, 8, 8, dtype=torch.uint8)).sum() == 0  # blank stays blank
    with pytest.raises(ValueError, match=r"images must be \(N, h, w\) uint8"):
        frame_like_mnist(torch.zeros(1, 8, 8))


def test_crop_is_an_exact_whole_pixel_shift_and_rotation_keeps_the_ink():
    images = torch.rand(16, 1, 12, 12)
    shifted = augment(images, Augmentation(crop_padding=2, max_rotation=0.0), torch.Generator().manual_seed(0))
    seen = set()
    for image, out in zip(images, shifted):
        padded = torch.nn.functional.pad(image, (2, 2, 2, 2))
        matches = [(dy, dx) for dy in range(5) for dx in range(5)
                   if torch.allclose(padded[:, 4 - dy : 16 - dy, 4 - dx : 16 - dx], out, atol=1e-6)]
        assert len(matches) == 1
        seen.add(matches[0])
    assert len(seen) > 5  # shifts differ from image to image
    blob = torch.zeros(4, 1, 28, 28)
    blob[:, :, 9:19, 11:17] = 1.0
    rotated = augment(blob, Augmentation(crop_padding=0, max_rotation=30.0), torch.Generator().manual_seed(1))
    assert not torch.allclose(rotated, blob) and torch.allclose(rotated.sum((1, 2, 3)), blob.sum((1, 2, 3)), rtol=0.03)
    again = augment(blob, Augmentation(crop_padding=0, max_rotation=30.0), torch.Generator().manual_seed(1))
    assert rotated.equal(again)
    with pytest.raises(ValueError, match="crop_padding must be >= 0"):
        Augmentation(crop_padding=-1)


def test_collate_augments_training_batches_around_the_normalised_background():
    processor = ImageProcessor(image_size=28)
    digits = Digits(torch.zeros(4, 28, 28, dtype=torch.uint8), torch.arange(4))
    digits.images[1, 10:18, 12:16] = 200
    examples = LabelledImages(digits.images, digits.labels, processor)
    torch.manual_seed(0)
    batch = ClassificationCollate(processor, Augmentation(crop_padding=3, max_rotation=15.0))([examples[i] for i in range(4)])
    background = -processor.mean / processor.std
    assert batch["pixel_values"].shape == (4, 1, 28, 28) and batch["labels"].tolist() == [0, 1, 2, 3]
    assert torch.allclose(batch["pixel_values"][0], torch.full((1, 28, 28), background), atol=1e-5)
    plain = ClassificationCollate(processor)([examples[1]])["pixel_values"][0]
    assert not torch.allclose(batch["pixel_values"][1], plain)
    assert torch.allclose(batch["pixel_values"][1].sub(background).sum(), plain.sub(background).sum(), rtol=0.05)


def test_processor_reads_a_dark_on_light_file_as_the_framed_digit(tmp_path):
    digit = opencv_digits().images[1234]
    Image.fromarray((255 - digit).repeat_interleave(3, 0).repeat_interleave(3, 1).numpy()).save(tmp_path / "d.png")
    processor = ImageProcessor(image_size=56)
    loaded = processor.load(tmp_path / "d.png")
    expected = processor.prepare(frame_like_mnist(digit[None]))
    assert loaded.shape == (1, 1, 56, 56)
    assert (loaded - expected).abs().mean() < 0.15 * expected.sub(expected.min()).abs().mean()
    with pytest.raises(ValueError, match="digit_frame needs num_channels=1"):
        ImageProcessor(image_size=224, num_channels=3)


def test_a_tiny_vit_learns_sklearn_digits(tmp_path):
    digits = sklearn_digits()
    split = stratified_split(digits.labels, {"test": 0.2})
    processor = ImageProcessor(image_size=8, digit_frame=False, mean=0.3, std=0.4)
    train = LabelledImages(digits.images[split["train"]], digits.labels[split["train"]], processor)
    test = LabelledImages(digits.images[split["test"]], digits.labels[split["test"]], processor)
    torch.manual_seed(0)
    model = ViT(ViTConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=64, num_hidden_layers=2,
                          num_attention_heads=2, intermediate_size=128, num_labels=10))
    before = accuracy(model, test, processor)
    config = TrainConfig(global_batch_size=64, micro_batch_size=64, max_steps=150, lr=1e-3, warmup_steps=10,
                         weight_decay=0.01, betas=(0.9, 0.99), progress=False, log_every=1000, output_dir=str(tmp_path))
    Trainer(model, config, Strategy()).fit(train, collate_fn=ClassificationCollate(processor))
    after = accuracy(model, test, processor)
    assert before < 0.3 and after > 0.9
