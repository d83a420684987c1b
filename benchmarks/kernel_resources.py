"""Every Triton kernel of memzoo compiled for a CUDA GPU on this machine: registers, spills, shared memory.

    python benchmarks/kernel_resources.py [--arch 90 80] [--norm-widths 128 768 ...] [--lattice-widths 201 ...]
                                              [--json out.json]

No GPU is needed: zoo.nn.kernels.cross_compile compiles each launch down to a cubin with the
ptxas of the triton wheel and reads what it needs from it. The launches below call each kernel's
host function at the shapes the zoo's models and the benchmarks use (widths 128-4096, vocabularies
500-50257, transducer lattices up to U+1 = 4096), in every dtype and with every feature switch it
takes. A row with spill bytes above 0 is a kernel that runs out of registers and goes to memory.
Run it without TRITON_INTERPRET=1 (the interpreter has no compiler to ask).
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch

from asr.losses import kernels as loss_kernels
from asr.losses.lattice import LATTICE_DTYPE
from zoo.nn.kernels import cross_entropy, elementwise, norm
from zoo.nn.kernels.activation_math import ACTIVATION_CODES
from zoo.nn.kernels.cross_compile import CompiledLaunch, compile_launches

NORM_WIDTHS = (128, 768, 1600, 4096)
LATTICE_WIDTHS = (201, 1024, 4096)
VOCABULARIES = (500, 5000)
DTYPES = (torch.float32, torch.bfloat16)


def launch_elementwise() -> None:
    for dtype in DTYPES:
        x, bias = torch.empty(4, 768, dtype=dtype), torch.empty(768, dtype=dtype)
        for activation in ACTIVATION_CODES:
            elementwise.bias_act_dropout_forward(x, bias, activation, 0.1, 0, "derivative", torch.bfloat16)
            elementwise.bias_act_dropout_backward(x, x, activation, 0.1, 0, "input")
        elementwise.bias_act_dropout_forward(x, None, "gelu", 0.0, 0, "input")
        elementwise.bias_act_dropout_backward(x, x.to(torch.bfloat16), "gelu", 0.0, 0, "derivative")
        elementwise.dropout_forward(x, 0.1, 0)


def launch_norms(widths: tuple[int, ...]) -> None:
    for dtype in DTYPES:
        for width in widths:
            x, weight = torch.empty(4, width, dtype=dtype), torch.empty(width, dtype=dtype)
            rstd = torch.empty(4)
            for kind in ("layer", "rms"):
                # dropout + residual + norm with weight and bias (post-LN), then a plain norm with weight only
                norm.norm_forward(x, x, weight, weight, 0.1, 0, 1e-5, kind, True)
                norm.norm_backward(x, x, x, rstd, weight, weight, 0.1, 0, kind, (True, True))
                norm.norm_forward(x, None, weight, None, 0.0, 0, 1e-5, kind, False)
                norm.norm_backward(x, None, x, rstd, weight, None, 0.0, 0, kind, (True, False))
            norm.norm_forward(x, x, None, None, 0.0, 0, 1e-5, None, True)
            norm.norm_backward(None, x, None, None, None, None, 0.1, 0, None, (False, False))


def launch_cross_entropy() -> None:
    labels = torch.zeros(4, dtype=torch.long)
    for smoothing in (0.0, 0.1):
        cross_entropy.chunk_loss_and_grad(torch.empty(4, 50257), labels, -100, smoothing, torch.ones(()))


def launch_lattices(widths: tuple[int, ...]) -> None:
    for width in widths:
        frames = 8
        diagonal = torch.empty(2, frames + width - 1, width, dtype=LATTICE_DTYPE)
        loss_kernels.regular_alpha_beta(diagonal, torch.empty(2, dtype=LATTICE_DTYPE), diagonal)
        grid = torch.empty(2, frames, width, dtype=LATTICE_DTYPE)
        lengths = torch.full((2,), frames), torch.full((2,), width - 1)
        loss_kernels.modified_alpha_beta(grid, grid, *lengths)


def launch_log_softmax_rows() -> None:
    for work_dtype, logit_dtypes in ((torch.float32, (torch.float32, torch.bfloat16, torch.float16)),
                                     (torch.float64, (torch.float64,))):
        for vocab in VOCABULARIES:
            for logit_dtype in logit_dtypes:
                logits, per_row = torch.empty(4, vocab, dtype=logit_dtype), torch.empty(4, dtype=work_dtype)
                labels = torch.ones(4, dtype=torch.long)
                loss_kernels.row_max_and_sum(logits, work_dtype)
                loss_kernels.write_gradient(logits, per_row, per_row, per_row, 0, per_row, labels, per_row, None,
                                            logits)
                loss_kernels.write_gradient(logits, None, None, per_row, 0, per_row, labels, per_row, 1.0, logits)


def compile_all(arch: int, norm_widths: tuple[int, ...], lattice_widths: tuple[int, ...]) -> list[CompiledLaunch]:
    """Every launch above compiled for sm_<arch>, norms and lattices at the widths given."""
    with compile_launches(arch) as launches:
        launch_elementwise()
        launch_norms(norm_widths)
        launch_cross_entropy()
        launch_lattices(lattice_widths)
        launch_log_softmax_rows()
    return launches


def table(launches: list[CompiledLaunch]) -> str:
    rows = ["| arch | kernel | pointer dtypes | constants | warps | registers | spill B | shared B |",
            "|---|---|---|---|---|---|---|---|"]
    for item in launches:
        pointers = sorted({kind[1:] for kind in item.arguments.values() if kind.startswith("*")})
        constants = " ".join(f"{name}={value}" for name, value in item.constants.items())
        rows.append(f"| sm_{item.arch} | {short_name(item.kernel)} | {','.join(pointers)} | {constants} "
                    f"| {item.num_warps} | {item.registers} | {item.spill_bytes} | {item.shared_bytes} |")
    return "\n".join(rows)


def short_name(kernel: str) -> str:
    """`zoo.nn.kernels.norm._forward_kernel` -> `kernels.norm._forward_kernel`."""
    return ".".join(kernel.split(".")[-3:])


def summary(launches: list[CompiledLaunch]) -> str:
    """One row per (arch, kernel): launches, the most registers and spill bytes among them, warps used."""
    groups: dict[tuple[int, str], list[CompiledLaunch]] = {}
    for item in launches:
        groups.setdefault((item.arch, item.kernel), []).append(item)
    rows = ["| arch | kernel | launches | registers (most) | spill B (most) | warps |", "|---|---|---|---|---|---|"]
    for (arch, kernel), items in groups.items():
        warps = ",".join(str(w) for w in sorted({item.num_warps for item in items}))
        rows.append(f"| sm_{arch} | {short_name(kernel)} | {len(items)} | {max(i.registers for i in items)} "
                    f"| {max(i.spill_bytes for i in items)} | {warps} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, nargs="+", default=[90], help="compute capabilities (90: H100, 80: A100)")
    parser.add_argument("--norm-widths", type=int, nargs="+", default=list(NORM_WIDTHS), help="row widths of the norms")
    parser.add_argument("--lattice-widths", type=int, nargs="+", default=list(LATTICE_WIDTHS),
                        help="transducer lattice columns U+1")
    parser.add_argument("--json", help="also write every launch as a JSON list to this file")
    args = parser.parse_args()
    widths = tuple(args.norm_widths), tuple(args.lattice_widths)
    launches = [item for arch in args.arch for item in compile_all(arch, *widths)]
    print(table(launches), summary(launches), sep="\n\n")
    spilling = sum(item.spill_bytes > 0 for item in launches)
    print(f"\n{len(launches)} launches compiled; {spilling} spill registers to memory")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump([dataclasses.asdict(item) for item in launches], handle, indent=1)


if __name__ == "__main__":
    main()
