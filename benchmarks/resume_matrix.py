"""Exact resume under every ZeRO stage x offload x precision (36 strategies; the suite runs a slice
that covers every pair): 6 steps straight against 3 + 3 resumed from the step-3 checkpoint of a
model built from another seed, every parameter bitwise equal (tests/trainers/test_checkpoints.py).

    python benchmarks/resume_matrix.py

Prints a Markdown table: per strategy "exact" or the first parameter that differs, and the seconds.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "trainers")]

from test_checkpoints import EVERY_STRATEGY, resumes_exactly  # noqa: E402


def main() -> None:
    print("| ZeRO | offload | precision | resumed | seconds |\n|---|---|---|---|---|")
    failed = 0
    for strategy in EVERY_STRATEGY:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as folder:
            try:
                resumes_exactly(Path(folder), strategy)
                outcome = "exact"
            except AssertionError as error:
                outcome, failed = f"differs: {str(error).splitlines()[0]}", failed + 1
        print(f"| {strategy.zero} | {strategy.offload} | {strategy.precision} | {outcome} | "
              f"{time.perf_counter() - started:.1f} |", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
