"""Compile Triton kernel launches for a CUDA GPU on a machine without one.

Inside `compile_launches(arch)`, every launch `kernel[grid](*args, **constants)` is not run: it is
specialised exactly as Triton's JIT would specialise it on a GPU (argument dtypes, 16-byte
alignment, constexpr values) and compiled by Triton's own pipeline down to a cubin for `sm_<arch>`
with the `ptxas` that ships in the triton wheel. Each launch is reported with the resources the
cubin needs per thread and per block, read by the bundled `cuobjdump`. The outputs of the launch
stay unwritten (`torch.empty`), so the code around it must not rely on their values.

This is how the kernels are checked to compile for a GPU, and how their register pressure and
spills are read, where only a CPU is at hand. It needs the compiled JIT: not `TRITON_INTERPRET=1`.
It drives Triton's JIT binder, an internal interface; it is written against triton 3.9.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from zoo.nn.backend import interpreting


@dataclasses.dataclass(frozen=True)
class CompiledLaunch:
    """One kernel launch compiled for a CUDA target, and what its cubin needs."""

    kernel: str
    """The kernel function's qualified name (`zoo.nn.kernels.norm._forward_kernel`)."""
    arguments: dict[str, str]
    """Each runtime argument's Triton type (`*fp32` is a float32 pointer, `i32` an int)."""
    constants: dict[str, object]
    """Each constexpr argument's value (block sizes, feature switches)."""
    arch: int
    """The compute capability compiled for (90: H100, 80: A100)."""
    num_warps: int
    """Warps per program (block of threads)."""
    registers: int
    """32-bit registers per thread."""
    spill_bytes: int
    """Bytes per thread of stack and local memory: register spills (0 when everything fits)."""
    shared_bytes: int
    """Shared memory per program, in bytes, as the launch requests it."""


@contextlib.contextmanager
def compile_launches(arch: int = 90) -> Iterator[list[CompiledLaunch]]:
    """Within the block, Triton launches compile for CUDA `sm_<arch>` instead of running; yields
    the list that receives one `CompiledLaunch` per launch. A kernel that does not compile raises
    Triton's compilation error at its launch."""
    if interpreting():
        raise RuntimeError("compile_launches needs Triton's compiler; unset TRITON_INTERPRET (it is 1)")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile, make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    launches: list[CompiledLaunch] = []

    def compile_instead_of_run(kernel, *args, grid, warmup, **kwargs):
        binder = create_function_from_signature(kernel.signature, kernel.params, backend)
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, constants, attributes = kernel._pack_args(backend, kwargs, bound, specialization, options)
        compiled = compile(ASTSource(kernel, signature, constants, attributes), target=target,
                           options=options.__dict__)
        registers, spill_bytes = _resource_usage(compiled.asm["cubin"])
        names = list(signature)
        launches.append(CompiledLaunch(
            kernel=f"{kernel.fn.__module__}.{kernel.__name__}",
            arguments={name: kind for name, kind in signature.items() if kind != "constexpr"},
            constants={names[path[0]]: value for path, value in constants.items()},
            arch=arch, num_warps=compiled.metadata.num_warps, registers=registers, spill_bytes=spill_bytes,
            shared_bytes=compiled.metadata.shared))

    original_run = JITFunction.run
    JITFunction.run = compile_instead_of_run
    try:
        yield launches
    finally:
        JITFunction.run = original_run


def _resource_usage(cubin: bytes) -> tuple[int, int]:
    """(registers per thread, stack + local bytes per thread) of the cubin's one kernel."""
    from triton import knobs

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        report = subprocess.run([knobs.nvidia.cuobjdump.path, "--dump-resource-usage", str(path)],
                                capture_output=True, text=True, check=True).stdout
    usage = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", report)
    if usage is None:
        raise RuntimeError(f"cuobjdump printed no resource usage:\n{report}")
    registers, stack, local = (int(group) for group in usage.groups())
    return registers, stack + local
