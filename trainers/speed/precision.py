"""`Strategy(precision="auto")`: bf16 where the device computes it natively, fp32 elsewhere.

A CPU without native bf16 (AVX2 only, or AVX-512 without its BF16 extension) converts every
bf16 matrix multiply through fp32 kernels that are not its fast path: such multiplies run many
times slower than fp32 ones. "auto" resolves, against the device this process trains on
(`trainers.parallel.mesh.use_cuda`), to bf16 on a GPU that supports it and on a CPU with AVX-512
BF16 or AMX, and to fp32 elsewhere (a warning); an explicit "bf16" is kept, with a warning where
it is slow. Each is logged once a process (the native choice at debug level).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator

import torch

from trainers.parallel.mesh import use_cuda
from zoo.torch_compat import cpu_bf16_native

log = logging.getLogger(__name__)


def native_bf16() -> tuple[bool, str]:
    """Whether the training device computes bf16 natively, and that device in words."""
    if use_cuda():
        return torch.cuda.is_bf16_supported(), torch.cuda.get_device_name()
    return cpu_bf16_native(), f"this CPU ({torch.backends.cpu.get_cpu_capability()})"


def resolve_precision(precision: str) -> str:
    """`precision` with "auto" resolved (see the module docstring); others unchanged."""
    if precision not in ("auto", "bf16"):
        return precision
    native, device = native_bf16()
    if precision == "bf16":
        if not native:
            _once(logging.WARNING, f"precision='bf16' on {device}, which has no native bf16: its matrix multiplies "
                                   "run many times slower than fp32 ones; precision='auto' computes in fp32 here")
        return "bf16"
    chosen = "bf16" if native else "fp32"
    _once(logging.WARNING if chosen == "fp32" else logging.DEBUG,
          f"precision='auto': {chosen} on {device}" + ("" if native else " (no native bf16)"))
    return chosen


@functools.cache
def _once(level: int, message: str) -> None:
    log.log(level, message)


@contextlib.contextmanager
def unannounced() -> Iterator[None]:
    """Within, precisions resolve without a word: for a process that checks a command line and
    trains nothing (a launcher; the ranks it starts say their own choice)."""
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)
