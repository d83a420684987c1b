"""Peak memory and time of loss + gradients: fused linear + cross-entropy (its gradients formed in
forward, and in backward) vs F.cross_entropy(x @ W.T).

    python benchmarks/fused_cross_entropy.py [--tokens 8192] [--vocab 50257] [--hidden 768]

Both run on the same inputs in one process. Peak = the largest total of tensor bytes alive at
once among those created during forward + backward (torch's MemTracker on CPU; the CUDA
allocator's peak above the inputs on a GPU), so the gradients of hidden and weight count for both.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from zoo.torch_compat import MemTracker

from zoo.nn import linear_cross_entropy


def naive(hidden, weight, labels):
    return F.cross_entropy((hidden @ weight.T).float(), labels)


def fused(hidden, weight, labels):
    return linear_cross_entropy(hidden, weight, labels)


def fused_in_backward(hidden, weight, labels):
    return linear_cross_entropy(hidden, weight, labels, gradients="backward")


def measure(loss_fn, hidden, weight, labels):
    hidden.grad = weight.grad = None
    started = time.perf_counter()
    if hidden.is_cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        loss = loss_fn(hidden, weight, labels)
        loss.backward()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        tracker = MemTracker()
        with tracker:
            loss = loss_fn(hidden, weight, labels)
            loss.backward()
        (per_device,) = tracker.get_tracker_snapshot("peak").values()
        peak = per_device["Total"]
    seconds = time.perf_counter() - started
    return loss.detach(), hidden.grad.clone(), weight.grad.clone(), peak, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, args.dtype)
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(args.tokens, args.hidden, generator=generator).to(device, dtype).requires_grad_()
    weight = (torch.randn(args.vocab, args.hidden, generator=generator) * 0.02).to(device, dtype).requires_grad_()
    labels = torch.randint(0, args.vocab, (args.tokens,), generator=generator).to(device)
    results = {name: measure(fn, hidden, weight, labels) for name, fn in (
        ("F.cross_entropy(x @ W.T)", naive), ("linear_cross_entropy", fused),
        ("linear_cross_entropy, gradients in backward", fused_in_backward))}
    (ref_loss, ref_h, ref_w, ref_peak, ref_s), *ours = results.values()
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"device {name}, torch {torch.__version__}, {args.tokens} tokens x vocab {args.vocab} x hidden {args.hidden}, {args.dtype}")
    print("| implementation | peak MiB | seconds |\n|---|---|---|")
    for label, (_, _, _, p, s) in results.items():
        print(f"| {label} | {p / 2**20:.1f} | {s:.2f} |")
    rel = lambda a, b: ((a.double() - b.double()).norm() / b.double().norm()).item()  # noqa: E731
    for label, (loss, grad_h, grad_w, peak, _) in zip(list(results)[1:], ours):
        print(f"\n{label}: peak ratio to naive {peak / ref_peak:.3f}; loss rel. diff {rel(loss, ref_loss):.1e}, "
              f"grad hidden {rel(grad_h, ref_h):.1e}, grad weight {rel(grad_w, ref_w):.1e}")


if __name__ == "__main__":
    main()
