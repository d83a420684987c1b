"""The data cache's writes when several processes fill it at once (the ranks of a run, the two
sessions of `make test`): each file and each unpacked folder appears whole, once."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

from zoo.downloads import unpacked_once, write_atomically


def _unpack_slowly(private: Path, tag: str) -> None:
    for index in range(20):
        (private / f"{index}.txt").write_text(tag)
        time.sleep(0.01)


def _unpack(folder: str, tag: str) -> list[str]:
    """What one process sees in `folder` after unpacking it (or finding it unpacked)."""
    done = unpacked_once(Path(folder), lambda private: _unpack_slowly(private, tag))
    return sorted(path.read_text() for path in done.iterdir())


def test_processes_unpacking_one_folder_at_once_all_see_one_whole_copy(tmp_path):
    folder = tmp_path / "cache" / "package"
    with multiprocessing.get_context("fork").Pool(3) as pool:
        seen = pool.starmap(_unpack, [(str(folder), tag) for tag in "abc"])
    winner = seen[0][0]
    assert all(files == [winner] * 20 for files in seen)  # every process read the same, complete copy
    assert sorted(path.name for path in folder.parent.iterdir()) == ["package"]  # no private copies left behind
    # Later calls find it and unpack nothing.
    assert unpacked_once(folder, lambda private: (private / "late.txt").write_text("x")) == folder
    assert not (folder / "late.txt").exists()


def test_a_failed_unpack_leaves_nothing_behind(tmp_path):
    folder = tmp_path / "package"

    def fail(private: Path) -> None:
        (private / "half.txt").write_text("half")
        raise RuntimeError("the archive is damaged")

    try:
        unpacked_once(folder, fail)
    except RuntimeError as error:
        assert "damaged" in str(error)
    else:
        raise AssertionError("the failure was swallowed")
    assert list(tmp_path.iterdir()) == []


def test_a_written_file_is_whole_and_its_temporary_gone(tmp_path):
    path = tmp_path / "data.bin"
    write_atomically(path, b"x" * 1000)
    write_atomically(path, "text")
    assert path.read_text() == "text" and [p.name for p in tmp_path.iterdir()] == ["data.bin"]
