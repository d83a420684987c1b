"""The bring-your-own-model matrix: every transformers family of tests/library_models.py under every
strategy of tests/distributed/library_scenarios.py, 3 steps on real gloo ranks against one process.

    python benchmarks/library_models.py [--models llama,qwen3,...] [--strategies tp2,zero3,...]

Prints a Markdown table: per family and strategy the largest relative error of the parameters after
the 3 steps (leaving out the key-projection biases, as tests/distributed/test_library_models.py does
and for its reason) and of the losses, or the error that refused the combination. The "quarter"
column compares with its own unconstrained run (128 examples a step) and gives the largest peak a
measured step held against the budget, a quarter of that run's peak. The "lora" columns compare with
one process training the same adapters.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
sys.path[:0] = [str(ROOT), str(TESTS), str(TESTS / "distributed")]  # the root first: tests/ mirrors its package names

from helpers import torchrun  # noqa: E402
from library_models import LIBRARY_MODELS  # noqa: E402
from library_scenarios import STRATEGIES, reference  # noqa: E402
from test_library_models import AMPLIFIED  # noqa: E402
from zoo.parity import relative_error  # noqa: E402


def cell(result: dict, reference: dict) -> str:
    if "refused" in result:
        kind, _, message = result["refused"].partition(": ")
        return f"refused ({kind}): {message[:90]}{'...' if len(message) > 90 else ''}"
    reference = result.get("reference", reference)  # a budget run's own unconstrained run
    params = max(relative_error(result["params"][k], v) for k, v in reference["params"].items()
                 if not k.endswith(AMPLIFIED))
    losses = max(abs(a - b) / abs(b) for a, b in zip(result["losses"], reference["losses"]))
    held = f"; peak {max(result['peaks']) / 2**20:.2f} of {result['budget'] / 2**20:.2f} MiB" if "budget" in result else ""
    return f"{params:.1e} / {losses:.1e}{held}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(LIBRARY_MODELS))
    parser.add_argument("--strategies", default=",".join(name for name in STRATEGIES if name not in ("one", "lora")))
    args = parser.parse_args()
    models, strategies = args.models.split(","), args.strategies.split(",")
    started, results = time.time(), {}
    with tempfile.TemporaryDirectory() as folder:
        references = sorted({reference(name) for name in strategies} - set(strategies))
        by_ranks: dict[int, list[str]] = {1: [f"{model}/{name}" for name in references for model in models]}
        for name in strategies:
            by_ranks.setdefault(STRATEGIES[name][0], []).extend(f"{model}/{name}" for model in models)
        for ranks, runs in sorted(by_ranks.items(), reverse=True):
            torchrun(ranks, "library", f"{folder}/{ranks}.pt", *runs, timeout=1800)
            results.update(torch.load(f"{folder}/{ranks}.pt"))
    print(f"device: CPU ({os.cpu_count()} cores), gloo; torch {torch.__version__}; {time.time() - started:.0f} s\n")
    print("parameters / losses: largest relative error after 3 steps against one process\n")
    print("| model | " + " | ".join(f"{name} ({STRATEGIES[name][0]} ranks)" for name in strategies) + " |")
    print("|---|" + "---|" * len(strategies))
    for model in models:
        print(f"| {model} | " + " | ".join(cell(results[f"{model}/{name}"], results[f"{model}/{reference(name)}"])
                                         for name in strategies) + " |")


if __name__ == "__main__":
    main()
