"""Every pipeline layout of tests/distributed/test_pipeline.py against one process (the suite runs
all but the layouts it leaves here, `COVERED`): 3 steps on real gloo ranks, losses, gradient norms,
evaluation loss and parameters within the test's tolerances.

    python benchmarks/pipeline_layouts.py

Prints a Markdown table: per layout "matches" or the assertion that failed.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "distributed")]

from helpers import torchrun  # noqa: E402
from test_pipeline import COVERED, EVERY_FOUR, EVERY_TWO, ONE, test_pipeline_matches_one_process  # noqa: E402


def main() -> None:
    started, runs = time.time(), {}
    with tempfile.TemporaryDirectory() as folder:
        for ranks, layouts in ((1, ONE), (4, EVERY_FOUR), (2, EVERY_TWO)):
            torchrun(ranks, "parity", f"{folder}/{ranks}.pt", *layouts, script="pipeline_worker.py", timeout=1800)
            runs.update(torch.load(f"{folder}/{ranks}.pt"))
    print(f"{time.time() - started:.0f} s\n\n| layout | in the suite | against one process |\n|---|---|---|")
    failed = 0
    for layout in (*EVERY_TWO, *EVERY_FOUR):
        try:
            test_pipeline_matches_one_process(runs, layout)
            outcome = "matches"
        except AssertionError as error:
            outcome, failed = f"differs: {str(error).splitlines()[0]}", failed + 1
        print(f"| {layout} | {'no' if layout in COVERED else 'yes'} | {outcome} |")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
