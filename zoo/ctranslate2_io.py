"""Reading CTranslate2 model files (`model.bin`) into tensors, without CTranslate2 itself.

The layout (binary version 6, CTranslate2's `ModelSpec._serialize`), little-endian:

    u32 version, string spec name, u32 spec revision, u32 n_variables,
    n_variables x (string name, u8 rank, rank x u32 dims, u8 dtype id, u32 n_bytes, n_bytes of data),
    u32 n_aliases, n_aliases x (string alias, string variable name)

A string is a u16 length (the terminating NUL included), the UTF-8 bytes and the NUL. Dtype ids:
0 float32, 1 int8, 2 int16, 3 int32, 4 float16, 5 bfloat16. Int8 variables are quantised weights
whose scales sit beside them (`<name>_scale`); they are returned as stored.

`load_ctranslate2` builds a zoo model from a CTranslate2 model folder through the importer of its
spec, found as a `memzoo.ctranslate2` entry point (name = spec name, value = a function folder ->
nn.Module), so the zoo imports no domain package. An Argos Translate package (the folder `model/`
beside `sentencepiece.model` and `metadata.json`) is read through its `model/` folder.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import torch
from torch import nn

ENTRY_POINT_GROUP = "memzoo.ctranslate2"
MODEL_FILE = "model.bin"
SUPPORTED_VERSIONS = (6,)
"""Binary versions read."""
DTYPES = (torch.float32, torch.int8, torch.int16, torch.int32, torch.float16, torch.bfloat16)
"""Tensor dtype of each dtype id."""


@dataclass
class CTranslate2Model:
    """The contents of one `model.bin`."""

    spec: str
    """Name of the model spec, e.g. "WhisperSpec"."""
    revision: int
    """Revision of that spec."""
    variables: dict[str, torch.Tensor]
    """Every stored variable by name (e.g. "encoder/layer_0/ffn/linear_0/weight"), shapes as stored;
    scalars are 0-d tensors."""
    aliases: dict[str, str]
    """Names that refer to another variable (e.g. a tied projection -> the embeddings)."""

    def __getitem__(self, name: str) -> torch.Tensor:
        """The variable `name`, following an alias; a missing name raises a KeyError naming the file's spec."""
        name = self.aliases.get(name, name)
        if name not in self.variables:
            raise KeyError(f"{self.spec} has no variable {name!r}")
        return self.variables[name]


class _Reader:
    """Sequential little-endian reads from a bytes buffer, with errors that say where the file ended."""

    def __init__(self, data: bytes, path: Path) -> None:
        self.data, self.path, self.offset = data, path, 0

    def take(self, size: int) -> memoryview:
        if self.offset + size > len(self.data):
            raise ValueError(f"{str(self.path)!r} is truncated: needed {size} bytes at offset {self.offset}, "
                             f"the file has {len(self.data)}")
        view = memoryview(self.data)[self.offset:self.offset + size]
        self.offset += size
        return view

    def number(self, fmt: str) -> int:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return bytes(self.take(self.number("H"))).rstrip(b"\0").decode("utf-8")


def ctranslate2_folder(folder: str | os.PathLike) -> Path | None:
    """The CTranslate2 model folder (the one holding model.bin) that `folder` is or, as an Argos
    Translate package, holds as `model/`; None for any other folder."""
    folder = Path(folder)
    for candidate in (folder, folder / "model"):
        if (candidate / MODEL_FILE).is_file():
            return candidate
    return None


def _model_file(path: str | os.PathLike) -> Path:
    path = Path(path)
    if path.is_dir():
        path = path / MODEL_FILE
    if not path.is_file():
        raise ValueError(f"path must be a CTranslate2 model.bin or a folder holding one; {str(path)!r} does not exist")
    return path


def _header(reader: _Reader) -> tuple[str, int]:
    version = reader.number("I")
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(f"{str(reader.path)!r}: CTranslate2 binary version must be one of {SUPPORTED_VERSIONS}; "
                         f"got {version} (is it a CTranslate2 model.bin?)")
    return reader.string(), reader.number("I")


def read_spec_name(path: str | os.PathLike) -> str:
    """The spec name of the CTranslate2 `model.bin` at `path` (or in the folder `path`), reading
    its header alone."""
    path = _model_file(path)
    with path.open("rb") as file:
        head = file.read(4 + 2 + 65535)
    return _header(_Reader(head, path))[0]


def load_ctranslate2(folder: str | os.PathLike) -> nn.Module:
    """Build the zoo model of a CTranslate2 model folder (or an Argos Translate package), through
    the importer of its spec."""
    found = ctranslate2_folder(folder)
    if found is None:
        raise ValueError(f"{str(folder)!r} holds no CTranslate2 {MODEL_FILE} (nor model/{MODEL_FILE})")
    spec = read_spec_name(found)
    importers = {entry.name: entry for entry in entry_points(group=ENTRY_POINT_GROUP)}
    if spec not in importers:
        raise ValueError(f"no importer for the CTranslate2 spec {spec!r} in {str(found)!r}; known: {sorted(importers)}")
    return importers[spec].load()(found)


def read_ctranslate2(path: str | os.PathLike) -> CTranslate2Model:
    """Every variable of the CTranslate2 `model.bin` at `path` (or in the folder `path`) as a CPU
    tensor in its stored dtype."""
    path = _model_file(path)
    reader = _Reader(path.read_bytes(), path)
    spec, revision = _header(reader)
    variables = {}
    for _ in range(reader.number("I")):
        name = reader.string()
        shape = tuple(reader.number("I") for _ in range(reader.number("B")))
        dtype_id = reader.number("B")
        if dtype_id >= len(DTYPES):
            raise ValueError(f"{str(path)!r}: variable {name!r} has dtype id {dtype_id}; known ids are 0-{len(DTYPES) - 1}")
        data = reader.take(reader.number("I"))
        dtype = DTYPES[dtype_id]
        if dtype == torch.bfloat16:  # numpy has no bfloat16: read the bits as int16 and view them
            array = torch.from_numpy(np.frombuffer(data, dtype=np.int16).copy()).view(torch.bfloat16)
        else:
            array = torch.from_numpy(np.frombuffer(data, dtype=torch.empty(0, dtype=dtype).numpy().dtype).copy())
        if array.numel() != int(np.prod(shape)):
            raise ValueError(f"{str(path)!r}: variable {name!r} holds {array.numel()} values for shape {shape}")
        variables[name] = array.reshape(shape)
    aliases = {}
    for _ in range(reader.number("I")):
        alias = reader.string()
        aliases[alias] = reader.string()
    return CTranslate2Model(spec, revision, variables, aliases)
