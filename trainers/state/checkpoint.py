"""Checkpoints with torch.distributed.checkpoint (DCP): sharded, reshardable, written atomically.

Layout of `checkpoint_dir`:
    step_00000100/      DCP shards of {"model", "optimizer"} + trainer_state.json
    latest              the name of the newest complete step folder
    step_00000100/manifest.json   every other file's size and CRC-32
A save is written to a hidden `.partial` folder and renamed when every rank has finished; only
then does `latest` move (itself replaced atomically), and checkpoints beyond the newest
`keep_checkpoints` are deleted. A crash mid-write leaves the previous checkpoint as `latest`,
untouched. On resume, rank 0 checks each candidate against its manifest (`integrity_problem`) and
every rank passes over the same damaged ones (`load_newest_intact`); a file that cannot be read,
and any other error while loading an intact checkpoint, is raised, never taken for damage.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from trainers.memory.chunks.checkpoint import ChunkedLoadPlanner, ChunkedSavePlanner, ChunkedTensor

STATE_FILE = "trainer_state.json"
MANIFEST_FILE = "manifest.json"
LATEST = "latest"
STEP_FOLDER = "step_{:08d}"
READ_BLOCK = 16 << 20
"""Bytes read at a time when a file's CRC-32 is taken."""
log = logging.getLogger("trainers")


class CorruptCheckpoint(ValueError):
    """A checkpoint folder that is missing, incomplete or fails its manifest (not merely another model's)."""


def file_crc32(path: Path) -> int:
    """The CRC-32 of the file at `path` (zlib's)."""
    crc = 0
    with path.open("rb") as file:
        while block := file.read(READ_BLOCK):
            crc = zlib.crc32(block, crc)
    return crc


def write_manifest(folder: Path) -> None:
    """Record the size and CRC-32 of every file in `folder` (flat, as DCP writes it)."""
    files = {path.name: [path.stat().st_size, file_crc32(path)] for path in sorted(folder.iterdir())
             if path.is_file() and path.name != MANIFEST_FILE}
    (folder / MANIFEST_FILE).write_text(json.dumps(files, indent=1))


def integrity_problem(folder: Path) -> str | None:
    """What is wrong with checkpoint `folder` against its manifest (None when nothing is): a missing
    or unparsable trainer state or manifest, or a file missing, of another size or another CRC-32
    than saved. A folder saved without a manifest is checked for its trainer state alone. A file
    that cannot be read (`OSError`: permissions, the disk) is no verdict on the checkpoint: raised."""
    try:
        read_trainer_state(folder)
    except CorruptCheckpoint as error:
        return str(error)
    manifest = folder / MANIFEST_FILE
    if not manifest.exists():
        return None
    try:
        files = json.loads(manifest.read_text())
    except json.JSONDecodeError as error:
        return f"checkpoint {str(folder)!r} is corrupt or incomplete: its {MANIFEST_FILE} cannot be parsed ({error})"
    for name, (size, crc) in files.items():
        path = folder / name
        if not path.is_file():
            return f"checkpoint {str(folder)!r} is corrupt or incomplete: {name} is missing"
        if path.stat().st_size != size:
            return (f"checkpoint {str(folder)!r} is corrupt or incomplete: {name} holds {path.stat().st_size:,} bytes, "
                    f"{size:,} were saved")
        if file_crc32(path) != crc:
            return f"checkpoint {str(folder)!r} is corrupt or incomplete: {name} differs from what was saved (CRC-32)"
    return None


def load_newest_intact(candidates: list[Path], load: Callable[[Path], dict[str, Any]]) -> tuple[Path, dict[str, Any]]:
    """The first of `candidates` that passes its integrity check, and what `load` returns for it
    (collective: rank 0 checks, and every rank passes over the same damaged ones, each logged on rank
    0). `CorruptCheckpoint` when none passes; an error of `load` is raised as it comes. An `OSError`
    while rank 0 reads a candidate (a file it may not read, a failing disk) is no damage: it is
    raised on every rank (on rank 0 as it came), none left waiting for the verdict."""
    damaged = []
    for candidate in candidates:
        verdict: list[tuple[str, str | None] | None] = [None]
        failure = None
        if dist.get_rank() == 0:
            try:
                verdict = [("checked", integrity_problem(candidate))]
            except OSError as error:
                failure, verdict = error, [("unreadable", f"reading checkpoint {str(candidate)!r} failed: {error}")]
        dist.broadcast_object_list(verdict, src=0)
        outcome, problem = verdict[0]
        if outcome == "unreadable":
            raise failure if failure is not None else OSError(f"on rank 0: {problem}")
        if problem is None:
            return candidate, load(candidate)
        damaged.append(problem)
        if dist.get_rank() == 0 and candidate != candidates[-1]:
            log.warning("%s; falling back to an older checkpoint", problem)
    raise CorruptCheckpoint("no intact checkpoint to resume from: " + "; ".join(damaged))


def _union_over(group: dist.ProcessGroup | None, local: dict[str, Any]) -> dict[str, Any]:
    """The union of every rank of `group`'s `local` dict, on each of them (collective)."""
    if group is None or dist.get_world_size(group) == 1:
        return local
    parts: list[dict[str, Any]] = [{} for _ in range(dist.get_world_size(group))]
    dist.all_gather_object(parts, local, group=group)
    return {name: value for part in parts for name, value in part.items()}


def model_signature(model: nn.Module, pipeline: dist.ProcessGroup | None = None) -> dict[str, list[int]]:
    """{parameter name: global shape}: what a checkpoint must match to load into `model`; with
    `pipeline`, the whole model's over the pipeline ranks, which each hold some stages (collective)."""
    signature = {name: list(t.shape) for name, t in get_model_state_dict(model).items()}
    return dict(sorted(_union_over(pipeline, signature).items()))


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


class TrainingStates(Protocol):
    """What holds the optimizer state (`trainers.state.optimizer.TrainOptimizer`), or all the model states
    (`trainers.memory.chunks.states.ChunkedStates`), as checkpoints see it."""

    def checkpoint_state(self, model: nn.Module) -> tuple[dict[str, Any], dict[str, ChunkedTensor]]:
        """{"model", "optimizer"} for DCP, and the tensors in it that stand in for ones to reach
        elsewhere (`trainers.memory.chunks.checkpoint`), by flattened key."""

    def restore_checkpoint(self, model: nn.Module, state: dict[str, Any]) -> None:
        """Install what DCP loaded into `checkpoint_state`'s dict."""


def save_checkpoint(directory: Path, step: int, model: nn.Module, optimizer: TrainingStates,
                    trainer_state: dict[str, Any], keep: int, pipeline: dist.ProcessGroup | None = None) -> Path:
    """Write the checkpoint of optimizer step `step` (steps done so far) on every rank, keep the newest
    `keep`; return its folder. `optimizer`: what holds the optimizer state (the model states, when
    chunked). `pipeline`: this rank's pipeline group, when ranks hold different stages."""
    final = directory / STEP_FOLDER.format(step)
    partial = directory / f".step_{step:08d}.partial"
    if dist.get_rank() == 0:
        for stale in directory.glob(".step_*.partial"):  # left by a save that crashed
            shutil.rmtree(stale)
    dist.barrier()
    signature = model_signature(model, pipeline)
    state, chunked = optimizer.checkpoint_state(model)
    # torch's FileSystemWriter holds every tensor of a file until the file is done: chunked states,
    # read from their chunks one tensor at a time, are written one file per tensor, so that no more
    # than one of them is held beside the chunks the memory budget keeps.
    writer = FileSystemWriter(partial, single_file_per_rank=not chunked)
    dcp.save(state, storage_writer=writer, planner=ChunkedSavePlanner(chunked))
    if dist.get_rank() == 0:
        state = dict(trainer_state, model_signature=signature)
        (partial / STATE_FILE).write_text(json.dumps(state, indent=1))
        write_manifest(partial)
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
        pointer = directory / f".{LATEST}.tmp"
        pointer.write_text(final.name)
        os.replace(pointer, directory / LATEST)
        prune_checkpoints(directory, keep)
    dist.barrier()
    return final


def latest_checkpoint(directory: Path) -> Path | None:
    """The folder `latest` names (which may since have been damaged), or None before the first save."""
    pointer = directory / LATEST
    if not pointer.exists():
        return None
    return directory / pointer.read_text().strip()


def saved_checkpoints(directory: Path) -> list[Path]:
    """The step folders in `directory` that a save completed (they hold the trainer state), newest first."""
    folders = [p for p in directory.glob("step_*") if p.is_dir() and (p / STATE_FILE).exists()]
    return sorted(folders, key=lambda p: p.name, reverse=True)


def resume_candidates(directory: Path | None) -> list[Path]:
    """Checkpoints to try on resume, best first: the one `latest` names, then every other complete one,
    newest first. Empty before the first save; ValueError for no directory (TrainConfig.checkpoint_dir unset)."""
    if directory is None:
        raise ValueError("TrainConfig.checkpoint_dir is not set; there is nothing to resume")
    latest = latest_checkpoint(directory)
    others = [p for p in saved_checkpoints(directory) if p != latest]
    return ([latest] if latest is not None else []) + others


def prune_checkpoints(directory: Path, keep: int) -> list[Path]:
    """Delete the complete checkpoints beyond the newest `keep` (never the one `latest` names);
    return the deleted folders. Call on one rank."""
    latest = latest_checkpoint(directory)
    stale = [p for p in saved_checkpoints(directory)[keep:] if p != latest]
    for folder in stale:
        shutil.rmtree(folder)
    return stale


def read_trainer_state(folder: Path) -> dict[str, Any]:
    """The JSON state saved beside the shards; `CorruptCheckpoint` when it is missing or not JSON,
    the `OSError` as it comes when it cannot be read."""
    try:
        return json.loads((folder / STATE_FILE).read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError) as error:
        raise CorruptCheckpoint(f"checkpoint {str(folder)!r} is missing or incomplete: its {STATE_FILE} cannot be "
                                f"read ({error})") from error


def load_checkpoint(folder: Path, model: nn.Module, optimizer: TrainingStates, model_class: str,
                    pipeline: dist.ProcessGroup | None = None) -> dict[str, Any]:
    """Load `folder` into the (possibly differently sharded or pipelined) model and optimizer;
    return its trainer state. `model_class` names the model in errors. Raises ValueError for
    another architecture, `CorruptCheckpoint` for a folder without its trainer state, RuntimeError
    when DCP fails to read it."""
    state = read_trainer_state(folder)
    expected, found = model_signature(model, pipeline), state.get("model_signature", {})
    if expected != found:
        missing = sorted(set(expected) - set(found))[:3]
        unexpected = sorted(set(found) - set(expected))[:3]
        reshaped = sorted(k for k in set(expected) & set(found) if expected[k] != found[k])[:3]
        raise ValueError(
            f"checkpoint {str(folder)!r} was saved from model {state.get('model_class')!r}, which does not "
            f"match this {model_class}: missing {missing}, unexpected {unexpected}, other shapes {reshaped}"
        )
    loading, views = optimizer.checkpoint_state(model)  # chunked tensors load straight into their chunks
    try:
        dcp.load(loading, checkpoint_id=folder, planner=ChunkedLoadPlanner(views))
    except CheckpointException as error:  # a BaseException: raised as an Exception, with the folder named
        raise RuntimeError(f"reading checkpoint {str(folder)!r} failed: {error}") from error
    optimizer.restore_checkpoint(model, loading)
    return state


def full_state_dict(model: nn.Module, pipeline: dist.ProcessGroup | None = None) -> dict[str, torch.Tensor]:
    """The whole model's parameters and buffers on the CPU of rank 0 (empty on other ranks);
    with `pipeline`, gathered from the pipeline ranks' stages (collective)."""
    if pipeline is None or dist.get_world_size(pipeline) == 1:
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    stage = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))  # gathered over dp, tp
    if 0 not in dist.get_process_group_ranks(pipeline):  # only rank 0's pipeline sends its stages
        return {}
    local = {name: value.cpu() for name, value in stage.items()}
    parts: list[dict[str, torch.Tensor]] = [{} for _ in range(dist.get_world_size(pipeline))]
    dist.gather_object(local, parts if dist.get_rank() == 0 else None, dst=0, group=pipeline)
    if dist.get_rank() != 0:
        return {}
    return {name: value for part in parts for name, value in part.items()}
