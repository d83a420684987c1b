"""Throughput of a training run: examples and tokens (the model's input unit) a second, and
model-FLOPs utilisation (MFU), a step's matrix-multiply FLOPs over its seconds and the device's
peak.

A step's FLOPs are counted once, this rank's share, by `trainers.estimate.counters.WorkCount`
(forward, backward and any recompute) on the step the memory report measures, and stand for every
step after it: exact when the steps' shapes are the same. The peak (`device_peak`) is the
datasheet's dense figure of a named GPU at the compute dtype, else the rate of large matrix
multiplies measured on the device, on as many threads as the process uses; the record names which.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from trainers.estimate.counters import WorkCount

GPU_PEAKS = {"H100": (989e12, 67e12), "H200": (989e12, 67e12), "A100": (312e12, 19.5e12)}
"""Dense matrix-multiply peak FLOP/s (bf16 or fp16, fp32 without TF32) of GPUs by the name they
report (SXM parts)."""
MEASURED_SIZE = 512
"""Side of the square matrices whose multiply measures a peak (CPU, an unnamed GPU)."""


@dataclass(frozen=True)
class DevicePeak:
    """A device's matrix-multiply peak at one dtype."""

    flops: float
    """FLOP/s."""
    source: str
    """Where the figure comes from (a datasheet, or measured here)."""


def device_peak(device: torch.device, dtype: torch.dtype, seconds: float = 0.2) -> DevicePeak:
    """The matrix-multiply peak of `device` at `dtype` (see the module docstring); measured once a
    process for each device, dtype and thread count (measuring takes `seconds`)."""
    return _device_peak(torch.device(device), dtype, seconds, torch.get_num_threads())


@cache
def _device_peak(device: torch.device, dtype: torch.dtype, seconds: float, threads: int) -> DevicePeak:
    low = dtype in (torch.bfloat16, torch.float16)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, (half, single) in GPU_PEAKS.items():
            if key in name:
                return DevicePeak(half if low else single, f"{name} datasheet, dense {dtype}")
    square = torch.randn(MEASURED_SIZE, MEASURED_SIZE, device=device, dtype=dtype)
    square @ square
    started, calls = time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        square @ square
        calls += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    rate = 2 * MEASURED_SIZE**3 * calls / (time.perf_counter() - started)
    on = f", {threads} thread(s)" if device.type == "cpu" else ""
    return DevicePeak(rate, f"measured {MEASURED_SIZE}^3 {dtype} matrix multiplies on {device.type}{on}")


class Throughput:
    """Completes each step's record with its rates (`complete`) once the step's FLOPs are counted
    (`counting`)."""

    def __init__(self, global_batch_size: int, unit: str, device: torch.device, dtype: torch.dtype) -> None:
        self.global_batch_size, self.unit, self.device, self.dtype = global_batch_size, unit, device, dtype
        self.flops: float | None = None
        """This rank's matrix-multiply FLOPs a step, once counted."""
        self.peak: DevicePeak | None = None
        self.last_mfu: float | None = None

    def counting(self, count: bool) -> AbstractContextManager:
        """Around a step: count its FLOPs when `count` and none are counted yet."""
        if not count or self.flops is not None:
            return nullcontext()
        return _Count(self)

    def complete(self, record: dict[str, Any], seconds: float) -> None:
        """Add the step's seconds, examples (and `unit`s) a second and, once FLOPs are counted, its
        FLOPs, MFU and the peak's source."""
        record["step_seconds"] = seconds
        record["examples_per_second"] = self.global_batch_size / seconds
        if self.unit in record:
            record[f"{self.unit}_per_second"] = record[self.unit] / seconds
        if self.flops is not None:
            self.last_mfu = self.flops / seconds / self.peak.flops
            record.update(flops=self.flops, mfu=self.last_mfu, mfu_peak=self.peak.source)

    def figures(self) -> dict[str, Any]:
        """FLOPs a step, the last MFU and the peak's source (empty before the count)."""
        if self.flops is None:
            return {}
        return {"flops_per_step": self.flops, "mfu": self.last_mfu, "mfu_peak": self.peak.source}


class _Count(AbstractContextManager):
    def __init__(self, throughput: Throughput) -> None:
        self.throughput, self.counter = throughput, WorkCount()

    def __enter__(self) -> _Count:
        self.counter.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.counter.__exit__(*exc)
        if exc[0] is None:
            self.throughput.flops = float(self.counter.work.flops)
            self.throughput.peak = device_peak(self.throughput.device, self.throughput.dtype)
