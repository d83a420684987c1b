"""Activation swapping under chunked model states (`Strategy(offload="chunks",
swap_activations=...)`): what the step's other tensors (activations, temporaries) hold at their
peak, the process's peak RSS, and throughput, with saved activations kept or swapped, each with and
without block recompute; then each block's choice made under a budget for a fraction of what the
blocks save (`Strategy(activation_memory=)`, `trainers.memory.activations.plan`), the fractions of
--plans. Without a device tier (a CPU machine without --device-memory) activations swap to files
(`trainers.memory.activations.swap`); with one (a GPU, or --device-memory on a CPU machine: a second
pool of host memory standing for the device) from the device to host memory
(`trainers.memory.activations.host`), and the peak counts the step's tensors on the device (on a GPU
also torch.cuda.max_memory_allocated, chunks included).

Each row is a fresh process training GPT (GPT-2's vocabulary, 6 x 512, 512-token blocks of
Shakespeare in GPT-2 BPE, micro batches of 4, 2 per step) for a few steps with its states in chunks
under a budget that holds them all (8 GiB), so that the rows differ only in where activations go.
"Step tensors peak" is the most bytes of the step's other tensors alive at once, as the chunk
engine measured it in the first step (`trainers.memory.tensor_peak.TensorPeak`, the figure its placement
plans with), and where it falls: the moment of that step (each a change of the chunks in use) and
the chunks in use then, named by kind and their first tensor; peak RSS is getrusage's ru_maxrss at
the end.

    python benchmarks/activation_swap.py [--steps 3] [--min-bytes 1MiB] [--plans 0.5 0.25] [--dir DIR]
                                         [--device-memory 4GiB]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BLOCK = 512
"""Tokens per sequence."""


def run(recompute: str, swap: int | None, room: int | None, steps: int, directory: str,
        device_memory: int | None) -> dict:
    """Train one GPT in this process; its figures."""
    import torch

    from nlp.data import TokenBlocks
    from nlp.gpt import GPT, GPTConfig
    from nlp.tokenizers import GPT2Tokenizer
    from trainers import Strategy, TrainConfig, Trainer
    from zoo.corpora import shakespeare_text

    torch.manual_seed(0)
    tokenizer = GPT2Tokenizer()
    data = TokenBlocks(torch.tensor(tokenizer.encode(shakespeare_text()[:200_000])), BLOCK)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=BLOCK, n_layer=6, n_head=8, n_embd=512,
                          bias=False))
    strategy = Strategy(offload="chunks", offload_dir=directory, memory_budget="8GiB", recompute=recompute,
                        swap_activations=swap, activation_memory=room, device_memory_budget=device_memory)
    train = TrainConfig(max_steps=steps, global_batch_size=8, micro_batch_size=4, lr=1e-4, warmup_steps=1,
                        log_every=1, progress=False, output_dir=str(Path(directory) / "out"))
    trainer = Trainer(model, train, strategy)
    history = trainer.fit(data)
    later = history[1:] or history
    moments = trainer.chunks.placement.moments
    peak = max(range(len(moments)), key=lambda index: moments[index].device_other_bytes)
    tensors: dict[int, list[str]] = {}
    for member in trainer.chunks.members:
        tensors.setdefault(member.chunk, []).append(member.name)
    in_use = [f"{kind} {tensors[chunk][0]}" + (f" +{len(tensors[chunk]) - 1}" if len(tensors[chunk]) > 1 else "")
              for kind, chunk in sorted(moments[peak].chunks)]
    activations = trainer.block_activations
    plan = activations.choices if activations is not None else {}
    return {"recompute": recompute, "swap": swap, "room": room, "losses": [r["loss"] for r in history],
            "plan": [sum(1 for choice in plan.values() if choice == kind) for kind in ("keep", "swap", "recompute")],
            "saved_bytes": sum(cost.saved_bytes for cost in (activations and activations.costs) or ()),
            "step_tensors_peak": moments[peak].device_other_bytes, "peak_moment": [peak, len(moments), in_use],
            "cuda_peak": torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None,
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "swapped_per_step": [r.get("swapped_activation_bytes", 0) for r in history],
            "step_seconds": [r["step_seconds"] for r in history],
            "tokens_per_second": sum(r["tokens"] for r in later) / sum(r["step_seconds"] for r in later)}


def launch(recompute: str, swap: int | None, steps: int, directory: Path, device_memory: int | None,
           room: int | None = None) -> dict:
    """`run` in a fresh process (its files removed after)."""
    folder = Path(tempfile.mkdtemp(dir=directory))
    try:
        command = [sys.executable, __file__, "--run", recompute, "--steps", str(steps), "--dir", str(folder)]
        command += (["--swap-bytes", str(swap)] if swap else []) + (["--room", str(room)] if room is not None else [])
        command += ["--device-memory", str(device_memory)] if device_memory is not None else []
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(done.stderr.strip().splitlines()[-1])
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    import torch

    from trainers.estimate.devices import parse_bytes

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--min-bytes", default="1MiB", help="saved tensors of at least this size are swapped")
    parser.add_argument("--plans", type=float, nargs="*", default=[0.5, 0.25],
                        help="budgets for the blocks' kept activations, as fractions of what they save")
    parser.add_argument("--dir", default=None, help="where files go (default: a temporary folder)")
    parser.add_argument("--device-memory", default=None,
                        help="the device tier's budget (Strategy.device_memory_budget; default on a GPU: its free memory)")
    parser.add_argument("--run", choices=("none", "blocks"), help=argparse.SUPPRESS)
    parser.add_argument("--swap-bytes", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--room", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        device_memory = int(args.device_memory) if args.device_memory else None  # bytes, from `launch`
        print(json.dumps(run(args.run, args.swap_bytes, args.room, args.steps, args.dir, device_memory)))
        return
    swap = parse_bytes(args.min_bytes, "--min-bytes")
    device_memory = parse_bytes(args.device_memory, "--device-memory") if args.device_memory else None
    directory = Path(args.dir or tempfile.mkdtemp(prefix="swap-"))
    directory.mkdir(parents=True, exist_ok=True)
    print(f"{args.steps} steps of 2 x 4 x {BLOCK} tokens, GPT 6 x 512; swapped: saved tensors of {swap:,} bytes "
          f"and more; device tier: {args.device_memory or ('the free GPU memory' if torch.cuda.is_available() else 'none')}")
    print("| blocks | activations | step tensors peak | peak at (moment of step 1: chunks in use) | peak RSS | "
          "GPU peak | swapped per step | tokens/s (after step 1) | losses |")
    print("|---|---|---|---|---|---|---|---|---|")
    first = launch("none", None, args.steps, directory, device_memory, room=2**50)  # every block keeps, measured
    rows = [("keep | kept", first)] + [(f"{'recompute' if recompute == 'blocks' else 'keep'} | "
                                        f"{'swapped' if swapped else 'kept'}",
                                        launch(recompute, swapped, args.steps, directory, device_memory))
                                       for recompute, swapped in (("none", swap), ("blocks", None), ("blocks", swap))]
    print(f"(the blocks save {first['saved_bytes'] / 2**20:,.0f} MiB a micro batch)")
    for fraction in args.plans:
        room = int(fraction * first["saved_bytes"])
        row = launch("none", None, args.steps, directory, device_memory, room=room)
        kept, swapped, recomputed = row["plan"]
        rows.append((f"plan for {fraction:g} x ({room / 2**20:,.0f} MiB) | {kept} keep, {swapped} swap, "
                     f"{recomputed} recompute", row))
    for label, row in rows:
        moment, moments, in_use = row["peak_moment"]
        same = "same" if row["losses"] == first["losses"] else "DIFFER: " + ", ".join(f"{x:.6f}" for x in row["losses"])
        print(f"| {label} | {row['step_tensors_peak'] / 2**20:,.0f} MiB ({row['step_tensors_peak'] / first['step_tensors_peak']:.2f}x) "
              f"| {moment} of {moments}: {', '.join(in_use)} | {row['peak_rss'] / 2**30:.2f} GiB | "
              f"{'-' if row['cuda_peak'] is None else format(row['cuda_peak'] / 2**30, '.2f') + ' GiB'} | "
              f"{row['swapped_per_step'][-1] / 2**30:.2f} GiB | {row['tokens_per_second']:,.1f} | {same} |", flush=True)

if __name__ == "__main__":
    main()
