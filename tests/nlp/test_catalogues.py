"""Parallel text from Debian's gettext catalogues: the .mo reader against a file written here by
the format's layout, accelerator marks removed without touching identifiers, and a real package's
English -> German messages."""

from __future__ import annotations

import struct

import pytest

from nlp.translation.catalogues import _without_mnemonic, catalogue_pairs, read_mo


def write_mo(path, entries: dict[bytes, bytes]) -> None:
    """A little-endian .mo file of `entries` (msgid -> msgstr), the layout GNU msgfmt writes."""
    keys = sorted(entries)
    header_size, count = 28, len(keys)
    originals, translations = header_size, header_size + 8 * count
    data, tables = b"", {"o": [], "t": []}
    start = translations + 8 * count
    for kind, values in (("o", keys), ("t", [entries[k] for k in keys])):
        for value in values:
            tables[kind].append((len(value), start + len(data)))
            data += value + b"\0"
    head = struct.pack("<7I", 0x950412DE, 0, count, originals, translations, 0, 0)
    body = b"".join(struct.pack("<2I", *pair) for kind in ("o", "t") for pair in tables[kind])
    path.write_bytes(head + body + data)


def test_the_mo_reader_decodes_in_the_header_charset_and_leaves_plurals_out(tmp_path):
    write_mo(tmp_path / "a.mo", {
        b"": "Content-Type: text/plain; charset=ISO-8859-1\n".encode("latin-1"),
        b"Open file": "Datei öffnen".encode("latin-1"),
        b"menu\x04Quit": b"Beenden",
        b"%d file\0%d files": b"%d Datei\0%d Dateien",
    })
    assert read_mo(tmp_path / "a.mo") == {"": "Content-Type: text/plain; charset=ISO-8859-1\n",
                                           "Open file": "Datei öffnen", "menu\x04Quit": "Beenden"}
    (tmp_path / "b.mo").write_bytes(b"\x00" * 28)
    with pytest.raises(ValueError, match="is not a gettext .mo file"):
        read_mo(tmp_path / "b.mo")


@pytest.mark.parametrize(("text", "mark", "cleaned"), [
    ("_File", "_", "File"), ("Save _As...", "_", "Save As..."), ("文件(_F)", "_", "文件"), ("file_name", "_", "file_name"),
    ("__builtin_trap", "_", "__builtin_trap"), ("~Open", "~", "Open"), ("_File", "", "_File")])
def test_accelerator_marks_go_and_identifiers_stay(text, mark, cleaned):
    assert _without_mnemonic(text, mark) == cleaned


@pytest.mark.timeout(300)
def test_gnupgs_german_catalogue_gives_clean_unique_pairs():
    pairs = catalogue_pairs("gnupg", "de")
    assert len(pairs) > 2000 and len({english for english, _ in pairs}) == len(pairs)
    assert all(english != german and "\n" not in english + german and max(len(english), len(german)) <= 300
               for english, german in pairs)
    assert dict(pairs)["colon missing"] == "Doppelpunkt fehlt"
    with pytest.raises(ValueError, match=r"no catalogue 'emacs'; known: \['binutils', 'gcc'"):
        catalogue_pairs("emacs", "de")
    with pytest.raises(ValueError, match="gnupg-l10n holds no xx catalogue of gnupg"):
        catalogue_pairs("gnupg", "xx")
