"""How long the memory estimator takes on a model far larger than this machine could hold.

    python benchmarks/estimate_7b.py [--world 8]

Estimates a 7B GPT (32 blocks, width 4096, 32 heads, 50304 words, 2048 tokens, one sequence a
micro batch) at bf16, ZeRO-3 and recompute blocks on `world` ranks; prints the peak per rank, its
composition, the wall time (the estimating process's start included) and that process's peak
resident set.
"""

from __future__ import annotations

import argparse
import functools
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONFIG = dict(vocab_size=50304, block_size=2048, n_layer=32, n_head=32, n_embd=4096)


def main() -> None:
    from nlp.gpt import GPT, GPTConfig
    from trainers import Strategy, estimate_memory

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=8)
    args = parser.parse_args()
    ids = torch.randint(0, CONFIG["vocab_size"], (1, CONFIG["block_size"]))
    started = time.perf_counter()
    estimate = estimate_memory(functools.partial(GPT, GPTConfig(**CONFIG)), {"input_ids": ids, "labels": ids},
                               Strategy(zero=3, precision="bf16", recompute="blocks"), args.world)
    seconds = time.perf_counter() - started
    gib = 2**30
    parts = ", ".join(f"{name} {nbytes / gib:.2f}" for name, nbytes in estimate.at_peak().items() if nbytes)
    print(f"7B GPT, {args.world} ranks, bf16, ZeRO-3, recompute blocks: {estimate.peak / gib:.2f} GiB per rank ({parts} GiB)")
    print(f"estimated in {seconds:.1f} s; estimating process peak RSS "
          f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
