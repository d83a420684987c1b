"""Shared by the benchmarks: the time and the peak of tensor memory of one call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainers.memory.measure import cuda_workspace_bytes
from trainers.memory.tensor_peak import TensorPeak


def status_bytes(field: str) -> int:
    """A field of this process's /proc/self/status (VmRSS, or VmHWM: its own peak resident set, which
    getrusage's ru_maxrss is not: that keeps, across exec, the peak of the process that forked it) in bytes."""
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"/proc/self/status has no {field}")


def timed_peak(run: Callable[[], Any], device: torch.device) -> tuple[Any, float, int]:
    """(run()'s result, seconds, peak bytes of the tensors it created that were alive at once):
    `torch.cuda.max_memory_allocated` above the allocation before it on CUDA, `TensorPeak` elsewhere.
    On CUDA the cuBLAS workspaces are allocated before (`cuda_workspace_bytes`), so that no call
    counts them: before, the first call of a process did (about 65 MiB on the H200) and the later
    ones did not."""
    if device.type == "cuda":
        cuda_workspace_bytes(device, torch.float32)
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


def launch_ranks(script: str, ranks: list[int], out: str, arguments: list[str],
                 environment: dict[str, str] | None = None) -> list[dict]:
    """Run `script --worker --out OUT *arguments` under torchrun once per world size in `ranks`
    (OMP_NUM_THREADS=1 unless set); the workers append JSON lines to `out`, emptied first. Returns
    the rows read back."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text("")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **(environment or {})}
    for world in ranks:
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
                        script, "--worker", "--out", out, *arguments], check=True, env=env)
    return [json.loads(line) for line in Path(out).read_text().splitlines() if line.strip()]


def ranks_device() -> str:
    """What the launched ranks ran on, for a benchmark's header: GPUs with NCCL under
    MEMZOO_DEVICE=cuda, else the CPU cores with gloo."""
    if os.environ.get("MEMZOO_DEVICE") == "cuda":
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name()}, NCCL"
    return f"CPU ({os.cpu_count()} cores), gloo"


def finish_worker(out: str, rows: list[dict]) -> None:
    """End a launched rank: rank 0 appends `rows` to `out` as JSON lines, then every rank leaves
    the process group and exits (`trainers.parallel.mesh.exit_process`: no teardown aborts)."""
    import torch.distributed as dist

    from trainers.parallel.mesh import exit_process, shutdown_distributed

    if dist.get_rank() == 0:
        with open(out, "a") as sink:
            sink.writelines(json.dumps(row) + "\n" for row in rows)
    shutdown_distributed()
    exit_process(0)
