"""The process an estimate is traced in: a fresh one for each call, forked from a server that has
imported torch and the estimator once.

Tracing needs a process without a process group (`trainers.estimate.fake.fake_process_group`), so
estimates never run in the caller's. A spawned process would import torch and the estimator each
time (4 to 6 s on a 2-core laptop). multiprocessing's fork server imports them once, at the first
call, and forks each call's process from that clean state: every call still starts without a
process group, a dispatch mode or anything an earlier call traced. The server stays, idle, while
the calling process lives: one thread and 227 MiB of its own memory on the 2-core laptop (372 MiB
resident, the rest shared libraries). A call then starts in 0.033 s instead of 6.5
(`benchmarks/estimating_process.py`).

A forked process has the server's environment, not the caller's; `run_fresh` hands the caller's
`os.environ` over, so that MEMZOO_DEVICE, MEMZOO_KERNELS and OMP_NUM_THREADS are as the caller set
them when the call is made. As with a spawned process, the caller's `__main__` is imported in the
child (as `__mp_main__`): call from a script's `if __name__ == "__main__":` block.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

Result = TypeVar("Result")

PRELOADED = ("trainers.estimate.trace", "trainers.estimate.budget", "trainers.estimate.planner", "trainers.step", "trainers.estimate.fake",
             "trainers.estimate.fake_pipeline", "trainers.pipeline.step")
"""What the fork server imports once: the estimator and what its traces import."""


def run_fresh(function: Callable[..., Result], *args: Any) -> Result:
    """`function(*args)` in a fresh process forked from the estimating server, with the caller's
    environment; its result, or its exception raised here. `function` and `args` must pickle."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOADED))  # read when the server starts, at the first call
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        return pool.submit(_in_environment, dict(os.environ), function, *args).result()


def _in_environment(environment: dict[str, str], function: Callable[..., Result], *args: Any) -> Result:
    """`function(*args)` with `environment` as this process's (in the estimating process)."""
    os.environ.clear()
    os.environ.update(environment)
    return function(*args)
