"""Sentences of modern English for speech recognition, from several packaged sources, in spoken form
(`asr.spoken_form`), with one whole source held out as an unseen text domain.

Sources (`SOURCES`), each read once and cached as one sentence a line under data_dir()/asr_text:
    shakespeare   the 42 plays and poems (`zoo.corpora`, public domain)
    fortunes      Debian `fortunes`: quotations, jokes and definitions (the non-offensive set)
    python_docs   Debian `python3.11-doc`: the prose paragraphs of the documentation's reST sources
    movie, tweets, nyt, amazon
                  the human-rated VADER snippets (`zoo.corpora`, MIT): movie reviews, tweets, New York
                  Times editorials, Amazon product reviews
HELD_OUT_SOURCE ("amazon") is never trained on: its sentences are the held-out text domain.
LANGUAGE_MODEL_SOURCES are read by a language model only, never spoken in training nor seen by a tokenizer:
    wordnet       the usage examples of WordNet 3.0's glosses (Debian `wordnet-base`, WordNet 3.0
                  license): 48k short everyday phrases ("the camera panned across the room"), 38k of 3 words or more

A sentence is kept when its written form looks like prose (no URL, mention, markup or code: see
`_looks_like_code`) and its spoken form has min_words..max_words words; repeats are dropped.
"""

from __future__ import annotations

import hashlib
import logging
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from asr.spoken_form import expand_abbreviations, spoken_form
from zoo.corpora import shakespeare_text, vader_snippets
from zoo.downloads import data_dir, debian_package, unpacked_once, write_atomically

log = logging.getLogger(__name__)

SOURCES = ("shakespeare", "fortunes", "python_docs", "movie", "tweets", "nyt", "amazon")
HELD_OUT_SOURCE = "amazon"
"""The source never trained on (Amazon product reviews): the held-out text domain."""
LANGUAGE_MODEL_SOURCES = ("wordnet",)
"""Sources of text for a language model beside the training text; none is split or spoken."""
LANGUAGE_MODEL_SOURCE_CREDITS = {"wordnet": ("WordNet's usage examples", "WordNet 3.0 copyright 2006 by Princeton "
                                             "University, used under the WordNet 3.0 license")}
"""{source: (what it is, in words; the notice its license asks copies to carry)} of LANGUAGE_MODEL_SOURCES."""
FORTUNES_PACKAGE = "fortunes"
WORDNET_PACKAGE = "wordnet-base"
_USAGE_EXAMPLE = re.compile(r'"([^"]+)"')
"""A usage example in a WordNet gloss: the quoted text after the definition."""
PYTHON_DOCS_PACKAGE = "python3.11-doc"
FORTUNE_FILES_SKIPPED = ("art", "ascii-art", "debian", "linux", "computers", "perl", "startrek", "zippy")
"""Fortune files of pictures, program output or jargon that no everyday speaker says."""
TEXT_LAYOUT = 1
"""Version of the sentence extraction, part of each cache file's name."""
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]*[A-Z0-9])")
_CODE = re.compile(r"https?:|www\.|@\w|[{}\[\]<>=_\\|~^`*]|[A-Za-z]\.[A-Za-z]|\w\(|\d/\d|::")
_PAUSE = re.compile(r"\.{3,}|\u2026|--+|\u2014")
"""Ellipses and dashes: read as a pause (a comma)."""


@dataclass(frozen=True)
class TextSplitConfig:
    """How the sentences of the training sources are split, and which are kept."""

    min_words: int = 3
    """Shortest spoken sentence, in words."""
    max_words: int = 20
    """Longest spoken sentence, in words."""
    held_out_fraction: float = 0.02
    """Share of each training source's sentences in validation, and the same share in test (chosen
    by a hash of the sentence, so a sentence keeps its split when sources change)."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_words <= self.max_words:
            raise ValueError(f"TextSplitConfig needs 1 <= min_words <= max_words; got {self.min_words}, {self.max_words}")
        if not 0 < self.held_out_fraction < 0.5:
            raise ValueError(f"TextSplitConfig.held_out_fraction must be in (0, 0.5); got {self.held_out_fraction}")


def source_sentences(source: str, root: Path | None = None) -> list[str]:
    """The distinct prose sentences of `source` (one of SOURCES or LANGUAGE_MODEL_SOURCES) in spoken
    form, in reading order; cached under root (default data_dir())/asr_text."""
    if source not in SOURCES + LANGUAGE_MODEL_SOURCES:
        raise ValueError(f"source must be one of {SOURCES + LANGUAGE_MODEL_SOURCES}; got {source!r}")
    root = data_dir() if root is None else root
    cached = root / "asr_text" / f"{source}-{TEXT_LAYOUT}.txt"
    if cached.exists():
        return cached.read_text(encoding="utf-8").splitlines()
    cached.parent.mkdir(parents=True, exist_ok=True)
    log.info("extracting the %s sentences (once; cached as %s)", source, cached)
    spoken = (spoken_form(s) for text in _source_texts(source, root) for s in written_sentences(text))
    sentences = list(dict.fromkeys(s for s in spoken if s))
    write_atomically(cached, "".join(s + "\n" for s in sentences))
    return sentences


def written_sentences(text: str) -> list[str]:
    """The prose sentences of a written `text`: abbreviations expanded, ellipses and dashes made
    commas, cut after . ! ? before a capital or digit; sentences that look like code or markup are
    dropped."""
    text = " ".join(_PAUSE.sub(", ", expand_abbreviations(text)).split())
    return [s for s in _SENTENCE_END.split(text) if not _looks_like_code(s)]


def split_by_source(sentences: dict[str, list[str]], config: TextSplitConfig) -> dict[str, list[tuple[str, str]]]:
    """{source: spoken sentences} -> {"train", "validation", "test", "test_domain": [(source, sentence)]}:
    the sentences of min_words..max_words words; HELD_OUT_SOURCE's all in test_domain, the others'
    split by a hash of the sentence. A sentence is in one split only, whichever sources share it."""
    splits: dict[str, list[tuple[str, str]]] = {"train": [], "validation": [], "test": [], "test_domain": []}
    seen = set()
    for source in sorted(sentences, key=lambda s: s != HELD_OUT_SOURCE):  # the held-out source first
        for sentence in sentences[source]:
            if sentence in seen or not config.min_words <= len(sentence.split()) <= config.max_words:
                continue
            seen.add(sentence)
            if source == HELD_OUT_SOURCE:
                splits["test_domain"].append((source, sentence))
            else:
                splits[_hashed_split(sentence, config.held_out_fraction)].append((source, sentence))
    return splits


def _hashed_split(sentence: str, fraction: float) -> str:
    draw = int.from_bytes(hashlib.sha256(sentence.encode()).digest()[:8], "big") / 2**64
    return "validation" if draw < fraction else "test" if draw < 2 * fraction else "train"


def _looks_like_code(sentence: str) -> bool:
    """True for a URL, an @mention, markup or code characters, dotted or called names (os.path,
    f(x)) and dates with slashes."""
    return bool(_CODE.search(sentence))


def _source_texts(source: str, root: Path) -> Iterator[str]:
    """The written texts of `source`, each a run of sentences."""
    if source == "shakespeare":
        yield from _shakespeare_speeches(shakespeare_text(root))
    elif source == "fortunes":
        yield from _fortunes(_unpacked(FORTUNES_PACKAGE, root) / "usr/share/games/fortunes")
    elif source == "wordnet":
        yield from _usage_examples(_unpacked(WORDNET_PACKAGE, root) / "usr/share/wordnet")
    elif source == "python_docs":
        yield from _rest_paragraphs(_unpacked(PYTHON_DOCS_PACKAGE, root) / "usr/share/doc/python3.11/html/_sources")
    else:
        yield from (s["text"] for s in vader_snippets(root) if s["source"] == source)


def _unpacked(package: str, root: Path) -> Path:
    """The Debian `package`'s files unpacked under root/asr_text/<package> (once)."""
    return unpacked_once(root / "asr_text" / package, lambda private: subprocess.run(
        ["dpkg-deb", "-x", str(debian_package(package, root)), str(private)], check=True))


def _usage_examples(folder: Path) -> Iterator[str]:
    """The usage examples of the glosses in WordNet's data.{noun,verb,adj,adv} files (a synset a line,
    its gloss after "|": a definition, then examples in double quotes), each ended by a full stop."""
    for part in ("noun", "verb", "adj", "adv"):
        for line in (folder / f"data.{part}").read_text(encoding="latin-1").splitlines():
            if not line.startswith(" ") and "|" in line:  # the license header's lines start with spaces
                for example in _USAGE_EXAMPLE.findall(line.split("|", 1)[1]):
                    yield example.strip().rstrip(".!?;,") + "."


def _shakespeare_speeches(text: str) -> Iterator[str]:
    """Paragraphs of the plays without speaker names (a line in capitals) and stage directions."""
    for paragraph in re.split(r"\n\s*\n", text):
        lines = [line for line in paragraph.splitlines()
                 if not (line.strip().isupper() or line.strip().startswith(("Enter ", "Exit", "Exeunt", "[")))]
        yield re.sub(r"^\s*[A-Z][A-Za-z]*\.\s", "", " ".join(lines))


def _fortunes(folder: Path) -> Iterator[str]:
    """Every fortune of the plain-text fortune files (entries between lines of "%"), attribution
    lines ("-- Mark Twain") dropped."""
    for path in sorted(folder.iterdir()):
        if path.suffix or path.is_dir() or path.name in FORTUNE_FILES_SKIPPED:
            continue
        for entry in path.read_text(encoding="utf-8", errors="replace").split("\n%\n"):
            yield " ".join(line for line in entry.splitlines() if not line.lstrip().startswith("--"))


_REST_ROLE = re.compile(r":[\w:-]+:`~?!?([^`<]*?)\s*(?:<[^`>]*>)?`")
_REST_LINK = re.compile(r"`([^`<]+?)\s*<[^`>]*>`_+")
_REST_LITERAL = re.compile(r"``([^`]*)``")
_REST_EMPHASIS = re.compile(r"\*\*?([^*]+)\*\*?")


def _rest_paragraphs(folder: Path) -> Iterator[str]:
    """The prose paragraphs of the reST files under `folder`: unindented blocks that are no heading,
    directive, table, field or list of options, with roles, links, literals and emphasis reduced
    to their text."""
    for path in sorted(folder.rglob("*.rst.txt")):
        for block in re.split(r"\n\s*\n", path.read_text(encoding="utf-8", errors="replace")):
            lines = block.splitlines()
            if not lines or lines[0][:1].isspace() or lines[0].startswith(("..", ":", "|", "+", "=", "-", ">>>", "*")):
                continue
            if any(set(line.strip()) <= set("=-~^\"'#*+`") for line in lines):  # a heading's underline
                continue
            text = " ".join(line.strip() for line in lines).removesuffix("::")
            for pattern in (_REST_ROLE, _REST_LINK, _REST_LITERAL, _REST_EMPHASIS):
                text = pattern.sub(r"\1", text)
            yield text
