"""Reading CTranslate2 model files (`model.bin`) into tensors, without CTranslate2 itself.

The layout (binary version 6, CTranslate2's `ModelSpec._serialize`), little-endian:

    u32 version, string spec name, u32 spec revision, u32 n_variables,
    n_variables x (string name, u8 rank, rank x u32 dims, u8 dtype id, u32 n_bytes, n_bytes of data),
    u32 n_aliases, n_aliases x (string alias, string variable name)

A string is a u16 length (the terminating NUL included), the UTF-8 bytes and the NUL. Dtype ids:
0 float32, 1 int8, 2 int16, 3 int32, 4 float16, 5 bfloat16. Int8 variables are quantised weights
whose scales sit beside them (`<name>_scale`); they are returned as stored.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

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


def read_ctranslate2(path: str | os.PathLike) -> CTranslate2Model:
    """Every variable of the CTranslate2 `model.bin` at `path` (or in the folder `path`) as a CPU
    tensor in its stored dtype."""
    path = Path(path)
    if path.is_dir():
        path = path / "model.bin"
    if not path.is_file():
        raise ValueError(f"path must be a CTranslate2 model.bin or a folder holding one; {str(path)!r} does not exist")
    reader = _Reader(path.read_bytes(), path)
    version = reader.number("I")
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(f"{str(path)!r}: CTranslate2 binary version must be one of {SUPPORTED_VERSIONS}; got {version} "
                         "(is it a CTranslate2 model.bin?)")
    spec, revision = reader.string(), reader.number("I")
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
