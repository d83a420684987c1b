"""FASTA reading (protein.fasta): records over several lines, comments, and clear errors."""

from __future__ import annotations

import pytest

from protein.fasta import read_fasta


def test_records_over_lines_with_comments(tmp_path):
    path = tmp_path / "chains.fasta"
    path.write_text(";a comment\n>sp|P1|ONE first protein\nMKTA\nyiak\n\n>two\nGGSX*\n>\nACD\n")
    assert read_fasta(path) == [("sp|P1|ONE", "MKTAYIAK"), ("two", "GGSX"), ("record3", "ACD")]


@pytest.mark.parametrize("text, message", [
    ("", "holds no FASTA record"),
    ("MKT\n>a\nMK\n", "line 1 comes before any '>' header"),
    (">a\n>b\nMK\n", "record 'a' has no sequence"),
    (">a\nMK\n>a\nGG\n", r"record names must be unique; repeated: \['a'\]"),
    (">a\nMK1T\n", "record 'a': sequence has '1' at position 2"),
])
def test_bad_files_are_refused_with_the_record_named(tmp_path, text, message):
    path = tmp_path / "bad.fasta"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_fasta(path)


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        read_fasta(tmp_path / "none.fasta")
