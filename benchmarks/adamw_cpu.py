"""AdamW on the CPU, torch's single-tensor loop against its fused kernel: the seconds of one update
of a model's worth of fp32 parameters (as the chunked states update host chunks, and as the Trainer
updates offloaded masters), the bytes of temporaries it allocates beside the states, and how far
apart the two leave the parameters (they round differently).

    python benchmarks/adamw_cpu.py --millions 50 --tensors 200 --repeats 5
"""

from __future__ import annotations

import argparse
import platform
import time

import torch
from torch.optim.adamw import adamw

from trainers.memory.tensor_peak import TensorPeak


def update_seconds(states: list[list[torch.Tensor]], implementation: str, repeats: int) -> tuple[float, int]:
    """Median seconds of one AdamW update of `states` ([params, grads, exp_avgs, exp_avg_sqs], each a
    list of tensors) and the peak bytes of the tensors it allocates."""
    steps = [torch.tensor(1.0) for _ in states[0]]
    options = {"fused": True} if implementation == "fused" else {"foreach": False}
    times, temporaries = [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        with TensorPeak("cpu") as peak:
            adamw(*states, [], steps, amsgrad=False, beta1=0.9, beta2=0.95, lr=1e-4, weight_decay=0.1, eps=1e-8,
                  maximize=False, **options)
        times.append(time.perf_counter() - started)
        temporaries = max(temporaries, peak.peak)
    return sorted(times)[len(times) // 2], temporaries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--millions", type=float, default=50, help="millions of fp32 parameters updated")
    parser.add_argument("--tensors", type=int, default=200, help="tensors they are split into")
    parser.add_argument("--repeats", type=int, default=5, help="updates timed; the median is reported")
    args = parser.parse_args()
    total = int(args.millions * 1e6)
    size = total // args.tensors
    states = [[torch.randn(size) for _ in range(args.tensors)] for _ in range(4)]
    for exp_avg_sq in states[3]:
        exp_avg_sq.abs_()
    print(f"AdamW update of {size * args.tensors:,} fp32 parameters in {args.tensors} tensors, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, {platform.processor() or platform.machine()}")
    print("| implementation | seconds | parameters / s | temporaries (MiB) |")
    print("|---|---|---|---|")
    results = []
    for implementation in ("single-tensor", "fused"):
        copies = [[tensor.clone() for tensor in kind] for kind in states]  # each from the same states
        seconds, temporaries = update_seconds(copies, implementation, args.repeats)
        results.append(copies)
        print(f"| {implementation} | {seconds:.3f} | {size * args.tensors / seconds / 1e6:.0f} M | "
              f"{temporaries / 2**20:.1f} |")
    apart = max(((a - b).norm() / b.norm()).item() for a, b in zip(results[0][0], results[1][0]))
    differ = sum(int((a != b).sum()) for a, b in zip(results[0][0], results[1][0]))
    print(f"after {args.repeats} updates each: {differ:,} of {size * args.tensors:,} parameters differ; largest relative "
          f"difference of a tensor {apart:.1e}")


if __name__ == "__main__":
    main()
