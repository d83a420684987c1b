"""What a fresh machine's data cache costs before the first use: the held-out protein chains and
the ASR training text, each prepared in an empty data directory (the downloads made once first,
outside the timing).

    python benchmarks/cold_cache.py

Prints seconds per item; BENCHMARKS.md, "The test suite on a cold data cache".
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="memzoo-cold-"))
    os.environ["MEMZOO_DATA"] = str(folder)  # read by zoo.downloads.data_dir at each call
    from asr.training_text import SOURCES, source_sentences
    from protein.heldout import _read_chains

    try:
        _read_chains()  # downloads and unpacks the sources; then only the parse is timed
        for cache in (folder / "heldout").glob("chains-*.pt"):
            cache.unlink()
        started = time.perf_counter()
        chains = _read_chains()
        print(f"held-out chains: {len(chains)} parsed in {time.perf_counter() - started:.1f} s")
        for source in SOURCES:
            source_sentences(source)  # downloads, unpacks and extracts; then only the extraction is timed
        total = 0.0
        for source in SOURCES:
            next(iter((folder / "asr_text").glob(f"{source}-*.txt"))).unlink()
            started = time.perf_counter()
            count = len(source_sentences(source))
            seconds = time.perf_counter() - started
            total += seconds
            print(f"training text {source}: {count} sentences in {seconds:.1f} s")
        print(f"training text, all sources: {total:.1f} s")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
