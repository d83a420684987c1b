"""The experts' grouped product against one dense product of the same FLOPs (CPU or GPU): 4,096
routed rows of width 512 to 8 experts of hidden width 1,024 (uneven runs, one empty), fp32; the
two timed in turns, medians of 15.

    python benchmarks/moe_dispatch.py [--device cuda]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from zoo.nn.moe import _per_expert, _runs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    device = torch.device(parser.parse_args().device)
    torch.manual_seed(0)
    counts = [700, 300, 0, 900, 500, 400, 800, 496]
    rows, width, hidden = sum(counts), 512, 1024
    x = torch.randn(rows, width, device=device)
    experts = torch.randn(len(counts), width, hidden, device=device)
    dense = torch.randn(width, hidden, device=device)
    runs = _runs(counts, device)  # the runs' lengths and offsets, made once a layer call
    looped = lambda: torch.cat([run @ experts[e] for e, run in enumerate(x.split(counts))])  # noqa: E731
    variants = {"dense": lambda: x @ dense, "grouped": lambda: _per_expert(x, experts, runs), "one an expert": looped}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(15):
        for name, run in variants.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            run()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - started)
    dense_median = statistics.median(times["dense"])
    print(f"| product ({rows} x {width} x {hidden}, {device.type}, {torch.get_num_threads()} threads) | median ms | x dense |")
    print("|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {1e3 * statistics.median(values):.2f} | {statistics.median(values) / dense_median:.2f} |")


if __name__ == "__main__":
    main()
