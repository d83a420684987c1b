"""Folding one random sequence with a model, on CPU or GPU: seconds (the second of three folds), peak
memory (CUDA's max_memory_allocated, or the process's peak RSS, VmHWM, on CPU, before the third fold) and
the SDPA kernels the Evoformer's attentions ran in the third (the profiler's op names: flash,
efficient or math).

    python benchmarks/fold_inference.py [MODEL] [--length 256] [--device cpu|cuda] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from protein.folding import fold  # noqa: E402
from protein.residues import AMINO_ACIDS  # noqa: E402
from zoo.store import load  # noqa: E402


def peak_rss_mib() -> float:
    """This process's own peak resident set (VmHWM; getrusage's ru_maxrss would keep its parent's across exec)."""
    return int(next(line for line in open("/proc/self/status") if line.startswith("VmHWM")).split()[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="fold-tiny", help="a zoo name or model folder")
    parser.add_argument("--length", type=int, default=256, help="residues of the random sequence")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    sequence = "".join(AMINO_ACIDS[i] for i in torch.randint(len(AMINO_ACIDS), (args.length,), generator=generator))
    model = load(args.model).to(args.device).eval()
    cuda = args.device.startswith("cuda")
    fold(model, sequence)  # warm-up
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    fold(model, sequence)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    peak = (f"{torch.cuda.max_memory_allocated() / 2**20:,.0f} MiB max_memory_allocated" if cuda else
            f"{peak_rss_mib():,.0f} MiB peak RSS")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:  # after the peak
        fold(model, sequence)
    kernels = sorted({e.key for e in profile.key_averages() if e.key.startswith("aten::_scaled_dot_product")})
    print(f"{args.model}, {args.length} residues on {args.device}"
          f"{'' if cuda else f' ({args.threads} threads)'}: {seconds:.2f} s, {peak}; SDPA kernels: {', '.join(kernels)}")


if __name__ == "__main__":
    main()
