"""Using an image classifier: accuracy over a labelled set, and labels with probabilities for
image files (`zoo classify NAME IMAGE...`) from a model folder whose config.json holds its
"image_processor" and "labels" (and "output": "probabilities" for a model that returns them, as an
imported TensorFlow Lite classifier does, rather than {"logits"})."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from vision.preprocess import ClassificationCollate, ImageProcessor
from zoo.store import load, read_config


@torch.no_grad()
def accuracy(model: nn.Module, dataset: Sequence[dict[str, torch.Tensor]], processor: ImageProcessor,
             batch_size: int = 250) -> float:
    """Share of `dataset`'s examples whose argmax logit is their label (model put in eval mode)."""
    model.eval()
    collate = ClassificationCollate(processor)
    correct = 0
    for start in range(0, len(dataset), batch_size):
        batch = collate([dataset[i] for i in range(start, min(len(dataset), start + batch_size))])
        correct += (model(batch["pixel_values"])["logits"].argmax(-1) == batch["labels"]).sum().item()
    return correct / len(dataset)


@dataclass(frozen=True)
class Prediction:
    """The classes a model gives one image, most probable first."""

    path: str
    """The image file."""
    labels: tuple[str, ...]
    """Top class names."""
    probabilities: tuple[float, ...]
    """Their softmax probabilities."""


@torch.no_grad()
def classify_files(name: str | os.PathLike, paths: Sequence[str | os.PathLike], top_k: int = 3) -> list[Prediction]:
    """The `top_k` classes of each image file by the zoo model `name` (a name or folder)."""
    config = read_config(name)
    if "image_processor" not in config or "labels" not in config:
        raise ValueError(f"model {str(name)!r} is not an image classifier: its config.json has no "
                         f"'image_processor' and 'labels'")
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1; got {top_k}")
    processor, labels = ImageProcessor(**config["image_processor"]), config["labels"]
    model = load(name)
    pixel_values = torch.cat([processor.load(path) for path in paths])
    output = model(pixel_values)
    probabilities = output if config.get("output") == "probabilities" else output["logits"].float().softmax(-1)
    top = probabilities.topk(min(top_k, len(labels)), dim=-1)
    return [Prediction(str(path), tuple(labels[i] for i in indices.tolist()), tuple(values.tolist()))
            for path, values, indices in zip(paths, top.values, top.indices)]
