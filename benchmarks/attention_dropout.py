"""Attention with dropout on the CPU: the zoo's chunked path against SDPA (its math backend, the
only one with dropout on a CPU: what Hugging Face's models run), forward and backward.

    python benchmarks/attention_dropout.py [--shape 1,12,1024,64] [--p 0.1] [--steps 9]

q, k and v (B, H, S, D) laid out as a model's projections leave them ((B, S, H, D) transposed),
causal and not. The two implementations run in turns, one forward and backward each, the order
alternating, and each reports its median time and the bytes autograd saves for backward
(storages counted once, q, k and v excluded).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainers.memory.saved_activations import SavedActivations  # noqa: E402
from zoo.nn.attention import attention  # noqa: E402


def ours(q, k, v, causal: bool, p: float) -> torch.Tensor:
    return attention(q, k, v, causal=causal, dropout_p=p)


def sdpa(q, k, v, causal: bool, p: float) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="1,12,1024,64", help="B,H,S,D")
    parser.add_argument("--p", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=9)
    args = parser.parse_args()
    b, h, s, d = (int(n) for n in args.shape.split(","))
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, generator=generator).transpose(1, 2).requires_grad_() for _ in range(3))
    grad = torch.randn(b, h, s, d, generator=generator)
    implementations = {"ours": ours, "sdpa": sdpa}
    print(f"CPU, {torch.get_num_threads()} threads; torch {torch.__version__}; (B, H, S, D) = {(b, h, s, d)}, "
          f"dropout {args.p}, {args.steps} steps in turns\n")
    print("| causal | implementation | forward + backward ms (median) | saved MiB |\n|---|---|---|---|")
    for causal in (True, False):
        times = {name: [] for name in implementations}
        for step in range(args.steps + 1):
            order = list(implementations.items())
            for name, run in order if step % 2 else order[::-1]:
                started = time.perf_counter()
                run(q, k, v, causal, args.p).backward(grad)
                elapsed = time.perf_counter() - started
                if step:  # the first turn warms up
                    times[name].append(elapsed)
        for name, run in implementations.items():
            with SavedActivations(exclude=(q, k, v)) as saved:
                out = run(q, k, v, causal, args.p)
            del out
            print(f"| {causal} | {name} | {statistics.median(times[name]) * 1e3:.1f} | {saved.bytes / 2**20:.1f} |")
        ratio = statistics.median(times["sdpa"]) / statistics.median(times["ours"])
        print(f"| {causal} | sdpa / ours | {ratio:.2f}x | |")


if __name__ == "__main__":
    main()
