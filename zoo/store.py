"""Model folders on disk: `save`, `load`, `locate`, `list_models`.

A model folder holds the files `zoo.model_folder` names (weights, config.json, model card).
Shipped entries live in `zoo/weights/NAME`; entries made by recipes in `$MEMZOO_HOME/zoo/NAME`
(default ~/.cache/memzoo/zoo/NAME).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zoo.adapters.peft_format import load_peft_adapter
from zoo.ctranslate2_io import ctranslate2_folder, load_ctranslate2
from zoo.hf import is_hf_folder, load_hf
from zoo.model_folder import CONFIG_FILE, WEIGHTS_FILE, read_safetensors, write_model_folder
from zoo.registry import arch_of, get_architecture
from zoo.sources import package_folder

SHIPPED_DIR = Path(__file__).parent / "weights"


def user_zoo_dir() -> Path:
    """Where recipes write the models they train."""
    return Path(os.environ.get("MEMZOO_HOME", Path.home() / ".cache" / "memzoo")) / "zoo"


def _entries(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if (p / CONFIG_FILE).exists()) if root.is_dir() else []


def list_models() -> dict[str, Path]:
    """Every model the zoo can load by name: shipped ones, then the user's (which take precedence)."""
    return {folder.name: folder for root in (SHIPPED_DIR, user_zoo_dir()) for folder in _entries(root)}


def locate(name_or_path: str | os.PathLike) -> Path:
    """The folder of a model given by name or path; ValueError saying how to get it otherwise."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"name_or_path must be a zoo model name or a model folder path; got {name_or_path!r}")
    path = Path(name_or_path)
    if (path / CONFIG_FILE).exists():
        return path
    known = list_models()
    if str(name_or_path) in known:
        return known[str(name_or_path)]
    from zoo.recipes import recipe_producing  # local import: the recipe table is only needed here

    recipe = recipe_producing(str(name_or_path))
    hint = f"; train it with `zoo train {recipe}`" if recipe else ""
    raise ValueError(f"no model {str(name_or_path)!r} (neither a model folder nor a zoo name){hint}; known: {sorted(known)}")


def read_config(name_or_path: str | os.PathLike) -> dict[str, Any]:
    """The config.json of a model folder."""
    return json.loads((locate(name_or_path) / CONFIG_FILE).read_text())


def load(name_or_path: str | os.PathLike, device: str | torch.device = "cpu", refit: tuple[str, ...] = (),
         adapter: str | os.PathLike | None = None) -> nn.Module:
    """`load_base`, then the PEFT LoRA adapter in the folder `adapter` attached to the model
    (`zoo.adapters.load_peft_adapter`: refused by name when it was trained on another base;
    `zoo.adapters.merge_lora` folds it into the weights)."""
    model = load_base(name_or_path, device, refit)
    if adapter is not None:
        load_peft_adapter(model, adapter)
    return model


def load_base(name_or_path: str | os.PathLike, device: str | torch.device = "cpu", refit: tuple[str, ...] = ()) -> nn.Module:
    """Build the model a folder (or zoo name) describes and load its safetensors weights. A
    Hugging Face model folder (config.json with a model_type) is imported (`zoo.hf`); so is an entry
    whose config.json names a package `source` (`zoo.sources`) holding a Hugging Face or CTranslate2
    folder (`zoo.ctranslate2_io`); and an entry whose arch is "tflite" holds a TensorFlow Lite file
    (`zoo.tflite`, the file named by its "tflite"). refit:
    prefixes of weight names the caller fits anew (a folding model's confidence readout): their
    saved values are not read, and a folder made before they existed loads."""
    folder = locate(name_or_path)
    config = read_config(folder)
    if config.get("arch") == "tflite":  # a TensorFlow Lite file beside its card
        from zoo.tflite import read_tflite

        return read_tflite(folder / config["tflite"]).module.to(device)
    if "arch" not in config or "source" in config:  # a Hugging Face folder, or an entry made from a package's
        source = package_folder(config["source"]) if "source" in config else folder
        if is_hf_folder(source):
            return load_hf(source).to(device).eval()
        if "source" in config and ctranslate2_folder(source) is not None:
            return load_ctranslate2(source).to(device).eval()
        raise ValueError(f"{str(folder)!r} has a config.json with neither 'arch' (a zoo model) nor 'model_type' (Hugging Face)"
                         + (f", and its source {str(source)!r} holds neither kind of folder" if "source" in config else ""))
    architecture = get_architecture(config["arch"])
    model = architecture.model_class(architecture.config_class(**config["config"]))
    state = {name: value for name, value in read_safetensors(folder / WEIGHTS_FILE, device=str(device)).items()
             if not name.startswith(refit)}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [name for name in missing if not name.startswith(refit)]
    if missing or unexpected:
        raise ValueError(f"weights in {str(folder)!r} do not fit {config['arch']!r}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model.to(device).eval()


def save(model: nn.Module, directory: str | os.PathLike, *, card: str, extra: dict[str, Any] | None = None,
         state_dict: dict[str, torch.Tensor] | None = None, files: dict[str, bytes] | None = None) -> Path:
    """Write `model` as a model folder, atomically (a new folder replaces the old one whole).

    card: the README model card (markdown); extra: more config.json entries (tokenizer, metrics);
    state_dict: the weights when they are not `model.state_dict()` (e.g. gathered from shards);
    files: more files of the folder, name -> content (e.g. a decoding language model)."""
    architecture = arch_of(model)
    config = {"arch": architecture.name, "config": dataclasses.asdict(model.config), **(extra or {})}
    tensors = state_dict if state_dict is not None else model.state_dict()
    return write_model_folder(directory, tensors, config, card, files)
