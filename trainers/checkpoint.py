"""Checkpoints with torch.distributed.checkpoint (DCP): sharded, reshardable, written atomically.

Layout of `checkpoint_dir`:
    step_00000100/      DCP shards of {"model", "optimizer"} + trainer_state.json
    latest              the name of the newest complete step folder
A save is written to a hidden `.partial` folder and renamed when every rank has finished; only
then does `latest` move (itself replaced atomically). A crash mid-write leaves the previous
checkpoint as `latest`, untouched.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)

from trainers.optim import TrainOptimizer

STATE_FILE = "trainer_state.json"
LATEST = "latest"


def model_signature(model: nn.Module) -> dict[str, list[int]]:
    """{parameter name: global shape}: what a checkpoint must match to load into `model`."""
    return {name: list(t.shape) for name, t in get_model_state_dict(model).items()}


def ensure_writable(directory: str | os.PathLike) -> Path:
    """Create `directory` if needed and prove that files can be written there."""
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as error:
        raise ValueError(f"TrainConfig.checkpoint_dir={str(directory)!r} is not writable: {error}") from error
    return path


def save_checkpoint(directory: Path, step: int, model: nn.Module, optimizer: TrainOptimizer, trainer_state: dict[str, Any]) -> Path:
    """Write the checkpoint of optimizer step `step` (steps done so far) on every rank; return its folder."""
    final = directory / f"step_{step:08d}"
    partial = directory / f".step_{step:08d}.partial"
    if dist.get_rank() == 0:
        for stale in directory.glob(".step_*.partial"):  # left by a save that crashed
            shutil.rmtree(stale)
    dist.barrier()
    dcp.save({"model": get_model_state_dict(model), "optimizer": optimizer.state_dict()}, checkpoint_id=partial)
    if dist.get_rank() == 0:
        state = dict(trainer_state, model_signature=model_signature(model))
        (partial / STATE_FILE).write_text(json.dumps(state, indent=1))
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
        pointer = directory / f".{LATEST}.tmp"
        pointer.write_text(final.name)
        os.replace(pointer, directory / LATEST)
    dist.barrier()
    return final


def latest_checkpoint(directory: Path) -> Path | None:
    """The folder `latest` names, or None when there is no complete checkpoint yet."""
    pointer = directory / LATEST
    if not pointer.exists():
        return None
    folder = directory / pointer.read_text().strip()
    if not (folder / STATE_FILE).exists():
        raise ValueError(f"checkpoint {str(folder)!r} named by {str(pointer)!r} is missing or incomplete")
    return folder


def read_trainer_state(folder: Path) -> dict[str, Any]:
    """The JSON state saved beside the shards."""
    try:
        return json.loads((folder / STATE_FILE).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"checkpoint {str(folder)!r} has an unreadable {STATE_FILE}: {error}") from error


def load_checkpoint(folder: Path, model: nn.Module, optimizer: TrainOptimizer, model_class: str) -> dict[str, Any]:
    """Load `folder` into the (possibly differently sharded) model and optimizer; return its
    trainer state. `model_class` names the model in errors. Raises ValueError for another
    architecture or a corrupt checkpoint."""
    state = read_trainer_state(folder)
    expected, found = model_signature(model), state.get("model_signature", {})
    if expected != found:
        missing = sorted(set(expected) - set(found))[:3]
        unexpected = sorted(set(found) - set(expected))[:3]
        reshaped = sorted(k for k in set(expected) & set(found) if expected[k] != found[k])[:3]
        raise ValueError(
            f"checkpoint {str(folder)!r} was saved from model {state.get('model_class')!r}, which does not "
            f"match this {model_class}: missing {missing}, unexpected {unexpected}, other shapes {reshaped}"
        )
    model_state = get_model_state_dict(model)
    optimizer_state = optimizer.state_dict()
    try:
        dcp.load({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=folder)
    except (CheckpointException, OSError, RuntimeError) as error:  # CheckpointException is a BaseException
        raise ValueError(f"checkpoint {str(folder)!r} is corrupt or incomplete: {error}") from error
    set_model_state_dict(model, model_state)
    optimizer.load_state_dict(optimizer_state)
    return state


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's parameters and buffers on the CPU of rank 0 (empty on other ranks)."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
