"""Parallel text from the gettext catalogues of Debian packages: each program's English messages
(msgid) beside their human translations (msgstr) into one language.

`catalogue_pairs(name, language)` downloads the program's package once (`apt-get download`), keeps
its .mo files for that language, and returns (English, translation) pairs, cleaned: contexts
dropped, plural entries left out, keyboard-accelerator marks removed where the program uses them ("_File",
"~File", "文件(_F)"), whitespace collapsed, untranslated entries (translation equal to the English)
and entries longer than `MAX_CHARACTERS` dropped, each English message once (its first translation
in file order). `language` is a gettext locale: "de", "zh_CN".
"""

from __future__ import annotations

import re
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from zoo.downloads import data_dir, debian_package, unpacked_once

MAX_CHARACTERS = 300
"""Longest message kept (English or translation), in characters."""


@dataclass(frozen=True)
class Catalogue:
    """One program's catalogues in a Debian package."""

    name: str
    """What this module calls it ("gcc")."""
    package: str
    """The Debian package holding its .mo files; "{l10n}" stands for the language's LibreOffice
    suffix ("de", "zh-cn")."""
    mnemonic: str = ""
    """The character that marks a keyboard accelerator in its messages ("_", "~"); "" for none."""

    def package_for(self, language: str) -> str:
        return self.package.format(l10n=language.lower().replace("_", "-"))

    def folders_for(self, language: str) -> tuple[str, ...]:
        """Directory names its .mo files of `language` sit in (gettext's, or LibreOffice's "zh-CN")."""
        return (language, language.replace("_", "-"))


CATALOGUES = {catalogue.name: catalogue for catalogue in (
    Catalogue("gcc", "gcc-12-locales"),
    Catalogue("git", "git"),
    Catalogue("binutils", "binutils-common"),
    Catalogue("gnupg", "gnupg-l10n"),
    Catalogue("vim", "vim-runtime"),
    Catalogue("inkscape", "inkscape", "_"),
    Catalogue("gimp", "gimp-data", "_"),
    Catalogue("libreoffice", "libreoffice-l10n-{l10n}", "~"),
)}
"""The programs whose catalogues can be read, by name."""


def _unpacked_messages(package: str, root: Path) -> Path:
    """The .mo files of Debian `package`, unpacked once under root/catalogues/PACKAGE."""

    def unpack(private: Path) -> None:
        archive = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(debian_package(package, root))], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(private), "--wildcards", "*.mo"], input=archive, check=True,
                       capture_output=True)

    return unpacked_once(root / "catalogues" / package, unpack)


def read_mo(path: Path) -> dict[str, str]:
    """msgid -> msgstr of a compiled gettext catalogue (GNU gettext's .mo layout: magic, revision,
    count, offsets of the two tables of (length, offset) pairs), decoded in the header's charset;
    plural entries (msgid and its plural joined by NUL) are left out; a context stays as
    "context\x04msgid"."""
    data = path.read_bytes()
    magic = struct.unpack("<I", data[:4])[0]
    order = "<" if magic == 0x950412DE else ">" if magic == 0xDE120495 else None
    if order is None:
        raise ValueError(f"{path} is not a gettext .mo file (magic {magic:#x})")
    _, count, originals, translations = struct.unpack(order + "4I", data[4:20])

    def entries(table: int) -> list[bytes]:
        pairs = struct.unpack(order + f"{2 * count}I", data[table:table + 8 * count])
        return [data[offset:offset + length] for length, offset in zip(pairs[::2], pairs[1::2])]

    raw = dict(zip(entries(originals), entries(translations)))
    charset = re.search(rb"charset=([\w-]+)", raw.get(b"", b""))
    encoding = charset.group(1).decode() if charset else "utf-8"
    return {key.decode(encoding): value.decode(encoding) for key, value in raw.items() if b"\0" not in key}


def _without_mnemonic(text: str, mark: str) -> str:
    if not mark:
        return text
    text = re.sub(rf"\s*\({re.escape(mark)}\w\)", "", text)  # 文件(_F)
    return re.sub(rf"(?<![\w{re.escape(mark)}]){re.escape(mark)}(?=[^\W{re.escape(mark)}])", "", text)  # _File, ~File


def _cleaned(text: str, mark: str) -> str:
    return " ".join(_without_mnemonic(text, mark).split())


def catalogue_pairs(name: str, language: str, root: Path | None = None) -> list[tuple[str, str]]:
    """(English, translation) pairs of program `name`'s catalogues in `language` (module docstring)."""
    if name not in CATALOGUES:
        raise ValueError(f"no catalogue {name!r}; known: {sorted(CATALOGUES)}")
    catalogue = CATALOGUES[name]
    folder = _unpacked_messages(catalogue.package_for(language), data_dir() if root is None else root)
    files = sorted(path for path in folder.rglob("*.mo") if path.parent.parent.name in catalogue.folders_for(language))
    if not files:
        raise ValueError(f"{catalogue.package_for(language)} holds no {language} catalogue of {name}")
    pairs: dict[str, str] = {}
    for path in files:
        for key, value in read_mo(path).items():
            if not key or not value:  # the header, untranslated entries
                continue
            english = _cleaned(key.rsplit("\x04", 1)[-1], catalogue.mnemonic)
            translated = _cleaned(value, catalogue.mnemonic)
            if (english and translated and english != translated and english not in pairs
                    and max(len(english), len(translated)) <= MAX_CHARACTERS):
                pairs[english] = translated
    return list(pairs.items())
