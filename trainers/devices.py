"""What the planner's cost model knows of a device: its memory, the throughput a training step
reaches, and the bandwidth of its links; and memory sizes written with units ("80GiB")."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

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


GIB = 1 << 30

DEVICES = {
    # H100 SXM: 989 TFLOP/s dense bf16, 67 TFLOP/s fp32 (no TF32); NVLink 4 450 GB/s a direction;
    # 400 Gb/s InfiniBand per GPU; PCIe 5 x16.
    "h100": DeviceSpec("h100", 80 * GIB, 0.5 * 989e12, 0.5 * 67e12, 450e9, 50e9, 55e9, 8, True),
    # A100 SXM 80 GB: 312 TFLOP/s dense bf16, 19.5 fp32; NVLink 3 300 GB/s; 200 Gb/s InfiniBand; PCIe 4.
    "a100": DeviceSpec("a100", 80 * GIB, 0.5 * 312e12, 0.5 * 19.5e12, 300e9, 25e9, 25e9, 8, True),
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


def device_spec(device: str | DeviceSpec) -> DeviceSpec:
    """The preset named `device` ("h100", "a100"), "cpu" measured here, or `device` itself."""
    if isinstance(device, DeviceSpec):
        return device
    if device == "cpu":
        return measure_cpu()
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(map(repr, [*DEVICES, 'cpu']))} or a "
                         f"trainers.DeviceSpec; got {device!r}")
    return DEVICES[device]


def measure_cpu(seconds: float = 0.2) -> DeviceSpec:
    """This machine as a device: matrix-multiply throughput of one thread (ranks run with
    OMP_NUM_THREADS=1), fp32 and bf16; memory-copy bandwidth; gloo between ranks taken as a quarter
    of the copy bandwidth (each byte is copied into and out of shared memory by both ends); no
    overlap."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fp32, bf16 = _matmul_flops(torch.float32, seconds), _matmul_flops(torch.bfloat16, seconds)
    finally:
        torch.set_num_threads(threads)
    source = torch.ones(1 << 24, dtype=torch.uint8)
    target = torch.zeros_like(source)
    started, copies = time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        target.copy_(source)
        copies += 1
    copy_bandwidth = copies * source.numel() / (time.perf_counter() - started)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return DeviceSpec("cpu", memory, bf16, fp32, copy_bandwidth / 4, copy_bandwidth / 4, copy_bandwidth,
                      os.cpu_count() or 1, False)


def _matmul_flops(dtype: torch.dtype, seconds: float) -> float:
    a = torch.randn(512, 512).to(dtype)
    a @ a  # warm-up
    started, count = time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        a @ a
        count += 1
    return count * 2 * 512**3 / (time.perf_counter() - started)
