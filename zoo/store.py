"""Model folders on disk: `save`, `load`, `locate`, `list_models`.

A model folder holds
    model.safetensors   the weights (never a pickle)
    config.json         {"arch", "config", and whatever else the recipe records: tokenizer, metrics}
    README.md           the model card: what it is, the command that made it, its metrics
Shipped entries live in `zoo/weights/NAME`; entries made by recipes in `$MEMZOO_HOME/zoo/NAME`
(default ~/.cache/memzoo/zoo/NAME).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from zoo.registry import arch_of, get_architecture

SHIPPED_DIR = Path(__file__).parent / "weights"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
CARD_FILE = "README.md"


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


def load(name_or_path: str | os.PathLike, device: str | torch.device = "cpu") -> nn.Module:
    """Build the model a folder (or zoo name) describes and load its safetensors weights. A
    Hugging Face model folder (config.json with a model_type) is imported (`zoo.hf`)."""
    folder = locate(name_or_path)
    config = read_config(folder)
    if "arch" not in config or "source" in config:  # a Hugging Face folder, or an entry made from one
        from zoo.hf import is_hf_folder, load_hf  # local import: zoo.hf builds on this module
        from zoo.sources import package_folder

        source = package_folder(config["source"]) if "source" in config else folder
        if not is_hf_folder(source):
            raise ValueError(f"{str(folder)!r} has a config.json with neither 'arch' (a zoo model) nor 'model_type' (Hugging Face)")
        return load_hf(source).to(device).eval()
    architecture = get_architecture(config["arch"])
    model = architecture.model_class(architecture.config_class(**config["config"]))
    state = load_file(str(folder / WEIGHTS_FILE), device=str(device))
    missing, unexpected = model.load_state_dict(state, strict=False)
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


def write_model_folder(directory: str | os.PathLike, tensors: dict[str, torch.Tensor], config: dict[str, Any],
                       card: str | None = None, files: dict[str, bytes] | None = None) -> Path:
    """Write model.safetensors, config.json (and README.md, and `files`, name -> content) into
    `directory` atomically: they are written to a hidden sibling folder that then replaces
    `directory` whole."""
    reserved = {WEIGHTS_FILE, CONFIG_FILE, CARD_FILE} & set(files or {})
    if reserved or any(Path(name).name != name for name in files or {}):
        raise ValueError(f"files must be plain file names other than {WEIGHTS_FILE}, {CONFIG_FILE}, {CARD_FILE}; "
                         f"got {sorted(files or {})}")
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    target = Path(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp makes it private; a model folder is not
    save_file(tensors, str(staging / WEIGHTS_FILE))
    (staging / CONFIG_FILE).write_text(json.dumps(config, indent=1))
    if card is not None:
        (staging / CARD_FILE).write_text(card)
    for name, content in (files or {}).items():
        (staging / name).write_bytes(content)
    if target.exists():
        retired = staging.with_name(staging.name + ".old")
        os.replace(target, retired)
        os.replace(staging, target)
        shutil.rmtree(retired)
    else:
        os.replace(staging, target)
    return target
