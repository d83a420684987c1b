"""The files of a model folder and their atomic writing.

    model.safetensors   the weights (never a pickle)
    config.json         {"arch", "config", and whatever else the recipe records: tokenizer, metrics},
                        or a Hugging Face config
    README.md           the model card: what it is, the command that made it, its metrics
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
CARD_FILE = "README.md"


def read_safetensors(path: str | os.PathLike, device: str = "cpu") -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; ValueError naming the file when it is missing or damaged."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"weights file {str(path)!r} is missing")
    try:
        return load_file(str(path), device=device)
    except (SafetensorError, OSError) as error:
        raise ValueError(f"weights file {str(path)!r} is damaged or not a safetensors file: {error}") from error


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
