"""The figures behind tests/distributed/test_tensor_parallel.py's parity assertions (< 1e-5).

    python benchmarks/tensor_parallel_parity.py

Runs the test's layouts (one process, then 2 and 4 gloo ranks; models and data in
tests/distributed/worker.py) and prints, per layout against one process: the largest relative
error of the 3 step losses, of the parameters after them and of the gradients on a probe batch
before them (leaving out the same parameters the test does, for the reasons its docstring gives).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import torch

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path[:0] = [str(TESTS), str(TESTS / "distributed")]

from helpers import torchrun  # noqa: E402
from test_tensor_parallel import AMPLIFIED, FOUR, ONE, TWO, ZERO_GRADIENT  # noqa: E402


def relative(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.double() - expected.double()).norm() / expected.double().norm()).item()


def main() -> None:
    started = time.time()
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for nproc, layouts in ((1, ONE), (2, TWO), (4, FOUR)):
            torchrun(nproc, "tensor_parallel", f"{folder}/{nproc}.pt", *layouts, timeout=600)
            results.update(torch.load(f"{folder}/{nproc}.pt"))
    print(f"device: CPU ({os.cpu_count()} cores), gloo; torch {torch.__version__}; {time.time() - started:.0f} s\n")
    print("| model/tp/zero/sequence parallel | ranks | losses | parameters | gradients |\n|---|---|---|---|---|")
    for layout in TWO + FOUR:
        result, reference = results[layout], results[f"{layout.split('/')[0]}/1/0/0"]
        losses = max(abs(a - b) / abs(b) for a, b in zip(result["losses"], reference["losses"]))
        params = max(relative(result["params"][k], v) for k, v in reference["params"].items()
                     if v.any() and not k.endswith(AMPLIFIED))
        grads = max(relative(result["grads"][k], v) for k, v in reference["grads"].items()
                    if v.any() and not k.endswith(ZERO_GRADIENT))
        print(f"| {layout} | {2 if layout in TWO else 4} | {losses:.1e} | {params:.1e} | {grads:.1e} |")


if __name__ == "__main__":
    main()
