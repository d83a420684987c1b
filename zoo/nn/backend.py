"""Which implementation a fused op runs: its Triton kernel or its PyTorch path.

"auto" picks Triton when every tensor is on a CUDA device and Triton imports, PyTorch otherwise;
and PyTorch under the memory estimator's fake tensors, which a Triton kernel cannot read (the
PyTorch paths save what the kernels save, so the trace counts the same bytes), and under
torch.compile, whose Inductor fuses the PyTorch paths' element-wise operations into its own kernels
(the hand-written kernels serve eager runs).
"triton" forces the kernel (on CPU tensors it runs only under `TRITON_INTERPRET=1`, which is how
the kernels are tested without a GPU); "torch" forces the PyTorch path. The environment variable
`MEMZOO_KERNELS` ("auto" | "torch" | "triton") sets the default for every op.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Literal

import torch
from zoo.torch_compat import FakeTensorMode, current_dispatch_modes

Backend = Literal["auto", "torch", "triton"]
BACKENDS = ("auto", "torch", "triton")


@functools.cache
def triton_available() -> bool:
    """True when the `triton` package is installed."""
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def tracing_fake_tensors() -> bool:
    """Whether a `FakeTensorMode` is on the dispatch stack (the memory estimator's trace). Not
    torch.compile's tracing, which runs on fake tensors too but compiles its graph's kernels."""
    if torch.compiler.is_compiling():
        return False
    return any(isinstance(mode, FakeTensorMode) for mode in current_dispatch_modes())


def resolve_backend(backend: Backend | None, *tensors: torch.Tensor) -> Literal["torch", "triton"]:
    """The implementation to run for `tensors`; raises ValueError when "triton" cannot run."""
    choice = backend or os.environ.get("MEMZOO_KERNELS", "auto")
    if choice not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {choice!r}")
    on_gpu = all(t.is_cuda for t in tensors)
    if choice == "torch":
        return "torch"
    if choice == "auto":
        fused_elsewhere = tracing_fake_tensors() or torch.compiler.is_compiling()
        return "triton" if on_gpu and triton_available() and not fused_elsewhere else "torch"
    if not triton_available():
        raise ValueError("backend='triton' needs the triton package (pip install memzoo[gpu])")
    if not on_gpu and not interpreting():
        raise ValueError("backend='triton' on CPU tensors needs TRITON_INTERPRET=1 (the Triton interpreter)")
    return "triton"
