"""What the planner's cost model knows of a device: its memory, the throughput a training step
reaches, and the bandwidth of its links; and memory sizes written with units ("80GiB")."""

from __future__ import annotations

import functools
import json
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class DeviceSpec:
    """One device kind (per device, not per node)."""

    name: str
    memory: int
    """Bytes of device memory."""
    flops: float
    """Floating-point operations per second a training step's matrix multiplies reach in bf16/fp16
    (for the GPU presets: half the dense tensor-core peak)."""
    fp32_flops: float
    """The same in fp32."""
    node_bandwidth: float
    """Bytes per second one device sends to another device of its node (NVLink; for CPU ranks on
    one machine, what gloo moves through shared memory)."""
    network_bandwidth: float
    """Bytes per second one device sends to a device of another node."""
    host_bandwidth: float
    """Bytes per second between the device and host memory (PCIe for a GPU; a memory copy on CPU)."""
    devices_per_node: int
    """Devices that share the fast links (a node's GPUs; every rank of one CPU machine)."""
    overlap: bool
    """Whether data-parallel collectives run beside compute (NCCL on its own stream) rather than
    after it (gloo on the cores that compute)."""
    latency: float
    """Seconds a collective call costs besides its bytes."""
    memory_bandwidth: float
    """Bytes per second that element-wise operators, reductions and copies read and write."""
    op_seconds: float
    """Seconds each operator call costs besides its work (framework dispatch: on CPU, in line with
    the work; zero for the GPU presets, whose asynchronous launches overlap the kernels)."""


GIB = 1 << 30

DEVICES = {
    # H100 SXM: 989 TFLOP/s dense bf16, 67 TFLOP/s fp32 (no TF32); NVLink 4 450 GB/s a direction;
    # 400 Gb/s InfiniBand per GPU; PCIe 5 x16.
    # NCCL's small-message latency, about 20 us. HBM3 3.35 TB/s, of which element-wise kernels reach
    # about 80%.
    "h100": DeviceSpec("h100", 80 * GIB, 0.5 * 989e12, 0.5 * 67e12, 450e9, 50e9, 55e9, 8, True, 20e-6, 0.8 * 3.35e12, 0.0),
    # A100 SXM 80 GB: 312 TFLOP/s dense bf16, 19.5 fp32; NVLink 3 300 GB/s; 200 Gb/s InfiniBand; PCIe 4;
    # HBM2e 2.04 TB/s.
    "a100": DeviceSpec("a100", 80 * GIB, 0.5 * 312e12, 0.5 * 19.5e12, 300e9, 25e9, 25e9, 8, True, 25e-6, 0.8 * 2.04e12,
                       0.0),
}
"""Presets; "cpu" is measured on this machine when asked for (`device_spec`)."""

UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_bytes(value: int | str, name: str = "memory_budget") -> int:
    """Bytes from an int or a string with a unit ("6GiB", "512 MiB", "80GB"); ValueError naming
    `name` and the accepted units otherwise."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]+)\s*", value) if isinstance(value, str) else None
    if match is None or match.group(2).lower() not in UNITS or float(match.group(1)) <= 0:
        raise ValueError(f"{name} must be a positive number of bytes or a string with a unit "
                         f"(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB; any case; "
                         f"e.g. '6GiB'); got {value!r}")
    return int(float(match.group(1)) * UNITS[match.group(2).lower()])


def device_spec(device: str | DeviceSpec, ranks: int = 2) -> DeviceSpec:
    """The preset named `device` ("h100", "a100"), "cpu" measured here for a job of `ranks`
    processes, or `device` itself."""
    if isinstance(device, DeviceSpec):
        return device
    if device == "cpu":
        return measure_cpu(ranks)
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(map(repr, [*DEVICES, 'cpu']))} or a "
                         f"trainers.DeviceSpec; got {device!r}")
    return DEVICES[device]


@functools.cache
def measure_cpu(ranks: int = 2, seconds: float = 0.2) -> DeviceSpec:
    """This machine as the device of each of `ranks` CPU processes (OMP_NUM_THREADS=1): one
    thread's matrix-multiply throughput (fp32 and bf16), element-wise bandwidth and seconds per
    operator call (an autograd-recorded add), shared when there are more ranks than cores; gloo's
    all-reduce bandwidth and per-call latency between min(ranks, 4) processes started for the
    measurement, between compute as in a step (`gloo_link`); memory-copy bandwidth for offload; no
    overlap. Measured once per process for each `ranks` and `seconds`: about 10 s on 2 cores, 8 of
    them starting the gloo processes."""
    cores = os.cpu_count() or 1
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        share = min(1.0, cores / max(ranks, 1))
        square = torch.randn(512, 512)
        fp32, bf16 = (share * 2 * 512**3 * _calls_per_second(lambda m=m: m @ m, seconds)
                      for m in (square, square.bfloat16()))
        a, b, total = torch.randn(1 << 22), torch.randn(1 << 22), torch.empty(1 << 22)
        elementwise = share * 3 * a.nbytes * _calls_per_second(lambda: torch.add(a, b, out=total), seconds)
        leaf, one = torch.ones(1, requires_grad=True), torch.ones(1)
        op_seconds = 1 / (share * _calls_per_second(lambda: leaf + one, seconds))  # an autograd-recorded add
    finally:
        torch.set_num_threads(threads)
    source = torch.ones(1 << 24, dtype=torch.uint8)
    target = torch.zeros_like(source)
    copy_bandwidth = source.numel() * _calls_per_second(lambda: target.copy_(source), seconds)
    bandwidth, latency = gloo_link(min(max(ranks, 2), 4))
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return DeviceSpec("cpu", memory, bf16, fp32, bandwidth, bandwidth, copy_bandwidth, max(cores, ranks), False, latency,
                      elementwise, op_seconds)


def gloo_link(ranks: int) -> tuple[float, float]:
    """(bytes per second, seconds per call) of gloo all-reduces among `ranks` processes of this
    machine, timed as a training step calls them: each between bursts of compute, which every rank
    must finish before the collective completes (with more ranks than cores, that costs scheduling
    rounds). A line through the median times of 512 KiB and 16 MiB all-reduces, each called
    after its compute; the mean over the ranks."""
    with tempfile.TemporaryDirectory() as folder:
        torch.multiprocessing.start_processes(_time_all_reduce, (ranks, folder), nprocs=ranks, start_method="spawn")
        links = [json.loads(Path(folder, f"link{rank}.json").read_text()) for rank in range(ranks)]
    return statistics.mean(link[0] for link in links), statistics.mean(link[1] for link in links)


LINK_PAYLOADS = ((1 << 17, 30), (1 << 22, 6))
"""(fp32 elements, repeats) of the two all-reduces `gloo_link` times."""


def _time_all_reduce(rank: int, ranks: int, folder: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(str(Path(folder, "store")), ranks), rank=rank, world_size=ranks)
    work = torch.randn(256, 256)

    def compute() -> None:  # a few milliseconds of a training step's matrix multiplies
        for _ in range(20):
            work @ work

    seconds = []
    for numel, repeats in LINK_PAYLOADS:
        payload = torch.ones(numel)
        calls = []
        for _ in range(repeats + 1):  # the first is a warm-up
            compute()
            started = time.perf_counter()
            dist.all_reduce(payload)
            calls.append(time.perf_counter() - started)
        seconds.append(statistics.median(calls[1:]))
    moved = [2 * (ranks - 1) / ranks * 4 * numel for numel, _ in LINK_PAYLOADS]
    bandwidth = (moved[1] - moved[0]) / max(seconds[1] - seconds[0], 1e-9)
    latency = max(seconds[0] - moved[0] / bandwidth, 0.0)
    Path(folder, f"link{rank}.json").write_text(json.dumps([bandwidth, latency]))
    dist.barrier()
    dist.destroy_process_group()


def _calls_per_second(run: Callable[[], object], seconds: float) -> float:
    """How often `run` completes per second, called for `seconds` after one warm-up call."""
    run()
    started, count = time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        run()
        count += 1
    return count / (time.perf_counter() - started)
