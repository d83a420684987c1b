"""Hugging Face model folders: read their safetensors weights as stored in the file, hand them to
the importer of their `model_type`, and hand a model to the exporter of its architecture (which
writes a folder transformers' `from_pretrained` loads, with `zoo.model_folder.write_model_folder`).

Importers are found through the `memzoo.hf` entry points (name = HF model_type, value = a function
folder -> nn.Module), exporters through `memzoo.hf_export` (name = zoo architecture, value = a
function (model, folder) -> folder), so the zoo imports no domain package. Only safetensors files are read
(never a pickle); sharded files (model.safetensors.index.json) are joined.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zoo.registry import arch_of
from zoo.model_folder import CONFIG_FILE, WEIGHTS_FILE, read_safetensors

ENTRY_POINT_GROUP = "memzoo.hf"
EXPORT_ENTRY_POINT_GROUP = "memzoo.hf_export"
INDEX_FILE = "model.safetensors.index.json"
LEGACY_NAMES = {"gamma": "weight", "beta": "bias"}
"""Old TensorFlow-converted LayerNorm parameter names and their current ones."""


def is_hf_folder(folder: str | os.PathLike) -> bool:
    """True for a folder whose config.json is a transformers config (it has a model_type)."""
    config = Path(folder) / CONFIG_FILE
    return config.exists() and "model_type" in json.loads(config.read_text())


def read_hf_config(folder: str | os.PathLike) -> dict[str, Any]:
    """The folder's transformers config.json."""
    path = Path(folder) / CONFIG_FILE
    if not path.exists():
        raise ValueError(f"{str(folder)!r} is not a Hugging Face model folder: it has no {CONFIG_FILE}")
    return json.loads(path.read_text())


def read_hf_state(folder: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors file(s), names as stored, with legacy LayerNorm
    `gamma`/`beta` renamed to `weight`/`bias`."""
    folder = Path(folder)
    if (folder / WEIGHTS_FILE).exists():
        files = [folder / WEIGHTS_FILE]
    elif (folder / INDEX_FILE).exists():
        files = [folder / name for name in sorted(set(json.loads((folder / INDEX_FILE).read_text())["weight_map"].values()))]
    else:
        found = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        raise ValueError(f"{str(folder)!r} has no {WEIGHTS_FILE} or {INDEX_FILE} (only safetensors are read); found {found}")
    state = {}
    for file in files:
        for name, tensor in read_safetensors(file).items():
            stem, _, leaf = name.rpartition(".")
            state[f"{stem}.{LEGACY_NAMES[leaf]}" if stem and leaf in LEGACY_NAMES else name] = tensor
    return state


class StateReader:
    """Takes a stored state dict apart by name: `take` pops one tensor (ValueError naming it when
    missing), `drop` discards entries that carry nothing (buffers, tied copies), and `finish` raises
    when names were left unread, so no weight is silently ignored."""

    def __init__(self, state: dict[str, torch.Tensor], prefixes: Iterable[str] = ()) -> None:
        self.state = dict(state)
        for prefix in prefixes:  # e.g. "transformer." or "bert.": stored with or without it
            if any(name.startswith(prefix) for name in self.state):
                self.state = {name.removeprefix(prefix): tensor for name, tensor in self.state.items()}

    def has(self, name: str) -> bool:
        return name in self.state

    def take(self, name: str) -> torch.Tensor:
        if name not in self.state:
            raise ValueError(f"the checkpoint has no tensor {name!r}; it has e.g. {sorted(self.state)[:8]}")
        return self.state.pop(name)

    def drop(self, predicate: Callable[[str], bool]) -> None:
        self.state = {name: tensor for name, tensor in self.state.items() if not predicate(name)}

    def finish(self) -> None:
        if self.state:
            raise ValueError(f"the checkpoint has {len(self.state)} tensors this model has no place for: {sorted(self.state)[:8]}")


def importers() -> dict[str, Callable[[Path], nn.Module]]:
    """HF model_type -> importer, from the `memzoo.hf` entry points."""
    return {entry.name: entry.load() for entry in entry_points(group=ENTRY_POINT_GROUP)}


def load_hf(folder: str | os.PathLike) -> nn.Module:
    """Build the zoo model of a Hugging Face model folder (its config.json and safetensors)."""
    model_type = read_hf_config(folder).get("model_type")
    known = importers()
    if model_type not in known:
        raise ValueError(f"no importer for Hugging Face model_type {model_type!r} in {str(folder)!r}; known: {sorted(known)}")
    return known[model_type](Path(folder))


def export_hf(model: nn.Module, directory: str | os.PathLike) -> Path:
    """Write `model` as a Hugging Face model folder, through the exporter of its architecture."""
    arch = arch_of(model).name
    exporters = {entry.name: entry for entry in entry_points(group=EXPORT_ENTRY_POINT_GROUP)}
    if arch not in exporters:
        raise ValueError(f"no Hugging Face export for architecture {arch!r}; exporters: {sorted(exporters)}")
    return exporters[arch].load()(model, directory)
