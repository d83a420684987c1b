"""A transformers model folder (its config.json) as transformers' own class, for a user who brings that
model rather than a zoo one: a builder of the class the config names (random weights; nothing is read
from the weights files) and the micro batch its head trains on. The trainers then read the plans the
class ships (`zoo.library_plan`)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from zoo.hf import read_hf_config

TOKEN_HEADS = ("ForCausalLM", "ForMaskedLM", "LMHeadModel")
"""Class-name endings of the heads trained on token ids: labels are the ids (the class shifts them)."""
IMAGE_HEADS = ("ForImageClassification",)
"""Class-name endings of the heads trained on images: labels are class indices."""


def architecture(folder: str | os.PathLike) -> str:
    """The transformers class the folder's config.json names first under "architectures"; ValueError
    naming the folder when it names none that this transformers has."""
    import transformers

    names = read_hf_config(folder).get("architectures") or []
    if not names or not isinstance(getattr(transformers, names[0], None), type):
        raise ValueError(f"{str(folder)!r}: config.json names no transformers class under \"architectures\" "
                         f"(got {names}) that transformers {transformers.__version__} has")
    return names[0]


def builder(folder: str | os.PathLike) -> Callable[[], nn.Module]:
    """A picklable callable that builds the folder's transformers class from its config, with random weights."""
    return functools.partial(_build, str(Path(folder).resolve()), architecture(folder))


def _build(folder: str, name: str) -> nn.Module:
    import transformers

    return getattr(transformers, name)(transformers.AutoConfig.from_pretrained(folder))


def example_batch(folder: str | os.PathLike, rows: int, length: int) -> dict[str, torch.Tensor]:
    """A micro batch of `rows` examples for the folder's head: `length` random token ids as input_ids
    and labels, or random images of the config's size with class labels; ValueError naming the class
    for any other head."""
    name, config = architecture(folder), read_hf_config(folder)
    generator = torch.Generator().manual_seed(0)
    if name.endswith(TOKEN_HEADS):
        ids = torch.randint(0, config["vocab_size"], (rows, length), generator=generator)
        return {"input_ids": ids, "labels": ids.clone()}
    if name.endswith(IMAGE_HEADS):
        size, labels = config["image_size"], len(config.get("id2label") or {0: 0, 1: 1})
        return {"pixel_values": torch.randn(rows, config.get("num_channels", 3), size, size, generator=generator),
                "labels": torch.randint(0, labels, (rows,), generator=generator)}
    raise ValueError(f"{name}: a micro batch is made for heads ending in {', '.join(TOKEN_HEADS + IMAGE_HEADS)}; "
                     "this one is none of them")
