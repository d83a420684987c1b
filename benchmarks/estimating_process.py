"""What the estimating process costs (`trainers.estimate.process`): the seconds a call takes to
start through the fork server against a freshly spawned process that imports the same modules,
and the memory the idle server holds while the calling process lives.

    python benchmarks/estimating_process.py [--calls 5]

Each call runs a function that returns at once, so its seconds are the process's start alone. The
server's memory is read from /proc: its resident set, and its private pages (what it holds that
no other process shares; the rest is shared libraries).
"""

from __future__ import annotations

import argparse
import importlib
import multiprocessing
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import forkserver
from pathlib import Path

from trainers.estimate.process import PRELOADED, run_fresh


def _nothing() -> int:
    return 0


def _imported_then_nothing() -> int:
    """What a spawned process would do before tracing: import what the fork server preloads."""
    for module in PRELOADED:
        importlib.import_module(module)
    return 0


def spawned_seconds() -> float:
    """Seconds of one call in a freshly spawned process that imports the estimator."""
    started = time.perf_counter()
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        pool.submit(_imported_then_nothing).result()
    return time.perf_counter() - started


def forked_seconds() -> float:
    """Seconds of one call through `run_fresh` (the server already started)."""
    started = time.perf_counter()
    run_fresh(_nothing)
    return time.perf_counter() - started


def server_memory_mib() -> tuple[float, float]:
    """(resident, private) MiB of the fork server, from /proc/PID/smaps_rollup."""
    pid = forkserver._forkserver._forkserver_pid
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value, *_ = line.split()
        fields[name.rstrip(":")] = int(value) / 1024
    return fields["Rss"], fields["Private_Clean"] + fields["Private_Dirty"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=5, help="calls of each kind (medians reported)")
    args = parser.parse_args()
    started = time.perf_counter()
    run_fresh(_nothing)  # starts the server: it imports the estimator once
    first = time.perf_counter() - started
    forked = statistics.median(forked_seconds() for _ in range(args.calls))
    spawned = statistics.median(spawned_seconds() for _ in range(args.calls))
    resident, private = server_memory_mib()
    print("| first call (starts the server) s | call through the server s | spawned call s | server resident MiB | "
          "server private MiB |")
    print("|---|---|---|---|---|")
    print(f"| {first:.2f} | {forked:.3f} | {spawned:.2f} | {resident:.0f} | {private:.0f} |")


if __name__ == "__main__":
    main()
