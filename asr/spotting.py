"""Using a keyword spotter: the keywords of WAV files, one second each (`zoo spot NAME WAV...`), from
a model folder whose config.json holds its "labels" and "features" (a name in
`asr.keywords.FEATURES`), and "output": "probabilities" for a model that returns them (an imported
TensorFlow Lite spotter) rather than {"logits"}."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from asr.keywords import FEATURES
from asr.spoken_digits import fsdd_clip
from zoo.store import load, read_config


@dataclass(frozen=True)
class Spotted:
    """The keywords a model hears in one file, most probable first."""

    path: str
    """The WAV file."""
    labels: tuple[str, ...]
    """Top keywords."""
    probabilities: tuple[float, ...]
    """Their probabilities."""


@torch.no_grad()
def spot_files(name: str | os.PathLike, paths: Sequence[str | os.PathLike], top_k: int = 3) -> list[Spotted]:
    """The `top_k` keywords of each WAV file (mono, any rate; its middle second if longer) by the zoo
    model `name` (a name or folder)."""
    config = read_config(name)
    if config.get("features") not in FEATURES or "labels" not in config:
        raise ValueError(f"model {str(name)!r} is not a keyword spotter: its config.json needs 'labels' and "
                         f"'features' (one of {sorted(FEATURES)}); got features={config.get('features')!r}")
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1; got {top_k}")
    features, labels = FEATURES[config["features"]], config["labels"]
    model = load(name).eval()
    batch = torch.stack([features(fsdd_clip(path)) for path in paths])
    output = model(batch)
    probabilities = output if config.get("output") == "probabilities" else output["logits"].float().softmax(-1)
    top = probabilities.topk(min(top_k, len(labels)), dim=-1)
    return [Spotted(str(path), tuple(labels[i] for i in indices.tolist()), tuple(values.tolist()))
            for path, values, indices in zip(paths, top.values, top.indices)]
