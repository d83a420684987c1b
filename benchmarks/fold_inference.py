"""Folding one random sequence with a model, on CPU or GPU: seconds (the second of three folds), peak
memory (CUDA's max_memory_allocated, or the process's peak RSS, VmHWM, on CPU, before the third fold) and
the SDPA kernels the Evoformer's attentions ran in the third (the profiler's op names: flash,
efficient or math), with --profile N the N ops that took the most time of their own in it.

    python benchmarks/fold_inference.py [MODEL] [--length 256] [--device cpu|cuda] [--threads 2]
                                        [--profile N] [--json]

--json prints the figures as one JSON object (what benchmarks/fold_heldout.py's fold cost reads).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from measure import status_bytes  # noqa: E402
from protein.folding import fold  # noqa: E402
from protein.residues import AMINO_ACIDS  # noqa: E402
from zoo.store import load  # noqa: E402


def measure_fold(model_name: str, length: int, device: str, profile_rows: int) -> dict:
    """{"seconds", "peak_mib", "peak_kind", "sdpa_kernels", "top_ops" ([name, self ms, calls] of the
    profile_rows ops with the most self time, CPU time on CPU and device time on CUDA)} of folding a
    random sequence of `length` residues (seeded) with the model on `device`."""
    generator = torch.Generator().manual_seed(0)
    sequence = "".join(AMINO_ACIDS[i] for i in torch.randint(len(AMINO_ACIDS), (length,), generator=generator))
    model = load(model_name).to(device).eval()
    cuda = device.startswith("cuda")
    fold(model, sequence)  # warm-up
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    fold(model, sequence)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated() if cuda else status_bytes("VmHWM")
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as profile:  # after the peak is read
        fold(model, sequence)
    averages = profile.key_averages()
    own = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    top = sorted(averages, key=own, reverse=True)[:profile_rows]
    return {"seconds": round(seconds, 3), "peak_mib": round(peak / 2**20, 1),
            "peak_kind": "max_memory_allocated" if cuda else "peak RSS (VmHWM)",
            "sdpa_kernels": sorted({e.key for e in averages if e.key.startswith("aten::_scaled_dot_product")}),
            "top_ops": [[e.key, round(own(e) / 1e3, 1), e.count] for e in top]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="fold-tiny", help="a zoo name or model folder")
    parser.add_argument("--length", type=int, default=256, help="residues of the random sequence")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", type=int, default=0, help="list the N ops with the most time of their own")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    figures = measure_fold(args.model, args.length, args.device, args.profile)
    if args.json:
        print(json.dumps(figures))
        return
    threads = "" if args.device.startswith("cuda") else f" ({args.threads} threads)"
    print(f"{args.model}, {args.length} residues on {args.device}{threads}: {figures['seconds']:.2f} s, "
          f"{figures['peak_mib']:,.0f} MiB {figures['peak_kind']}; SDPA kernels: {', '.join(figures['sdpa_kernels'])}")
    for name, milliseconds, calls in figures["top_ops"]:
        print(f"  {milliseconds:>10,.1f} ms  {calls:>6}x  {name}")


if __name__ == "__main__":
    main()
