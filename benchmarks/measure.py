"""Shared by the benchmarks: the time and the peak of tensor memory of one call."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from trainers.tensor_peak import TensorPeak


def timed_peak(run: Callable[[], Any], device: torch.device) -> tuple[Any, float, int]:
    """(run()'s result, seconds, peak bytes of the tensors it created that were alive at once):
    `torch.cuda.max_memory_allocated` above the allocation before it on CUDA, `TensorPeak` elsewhere."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        result = run()
        torch.cuda.synchronize()
        return result, time.perf_counter() - started, torch.cuda.max_memory_allocated() - base
    started = time.perf_counter()
    with TensorPeak() as tracked:
        result = run()
    return result, time.perf_counter() - started, tracked.peak
