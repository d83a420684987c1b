"""The largest GPT that trains under a process memory budget B on a CPU machine: model states in
memory (AdamW, fp32: 16 bytes a parameter) against states in chunks on disk
(`Strategy(offload="chunks")`, `trainers.memory.chunks.states`).

Each run is a fresh process training a GPT (GPT-2's 50,257-token vocabulary, 128-token blocks of
Shakespeare, 2 micro batches of 2) for a few steps; its peak resident memory is getrusage's
ru_maxrss at the end. A size fits when that peak is at most B. In-memory models, in a plain
PyTorch loop ("torch", the leanest peer) and in the Trainer ("memory"), grow in depth at width 512
until one does not fit; chunked runs train the sizes given by --chunked (GPT-2 medium's
24 x 1024 by default) and the largest in-memory sizes, so that throughput compares at equal size.
Disk traffic per step is set against its floor: every parameter, Adam moment chunk read once and
written once (12 bytes a parameter each way). With --ranks N the chunked sizes also train on N
ranks under ZeRO-3 over chunks (torchrun, gloo; the same 4 sequences a step, split over the
ranks), each rank a process under the budget: the peak is the largest rank's, the traffic rank
0's against its share of the floor.

    python benchmarks/tiered_memory.py [--budget 2GiB] [--steps 3] [--chunked 24x1024 ...] [--ranks N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WIDTH = 512
"""Width of the in-memory ladder."""
BLOCK = 128
"""Tokens per sequence."""


def gpt_and_data(layers: int, width: int, meta: bool = False):
    """GPT of `layers` blocks of `width` (GPT-2's vocabulary, 64-wide heads, no biases; on the meta
    device when `meta`) and 128-token blocks of Shakespeare."""
    import torch

    from nlp.data import TokenBlocks
    from nlp.gpt import GPT, GPTConfig
    from nlp.tokenizers import GPT2Tokenizer
    from zoo.corpora import shakespeare_text

    torch.manual_seed(0)
    tokenizer = GPT2Tokenizer()
    data = TokenBlocks(torch.tensor(tokenizer.encode(shakespeare_text()[:100_000])), BLOCK)
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=BLOCK, n_layer=layers, n_head=width // 64,
                       n_embd=width, bias=False)
    with torch.device("meta" if meta else "cpu"):
        return GPT(config), data


def run(mode: str, layers: int, width: int, steps: int, budget: int, directory: str) -> dict:
    """Train one GPT in this process; its figures."""
    from trainers import Strategy, TrainConfig, Trainer

    model, data = gpt_and_data(layers, width, meta=mode == "chunks")
    if mode == "torch":
        return plain_torch(model, data, steps) | {"mode": mode, "layers": layers, "width": width, "budget": budget}
    ranks = int(os.environ.get("WORLD_SIZE", "1"))
    strategy = None
    if mode == "chunks":
        strategy = Strategy(offload="chunks", offload_dir=directory, memory_budget=budget, zero=3 if ranks > 1 else 0)
    train = TrainConfig(max_steps=steps, global_batch_size=4, micro_batch_size=2, lr=1e-4, warmup_steps=1,
                        log_every=1, progress=False, output_dir=str(Path(directory) / "out"))
    started = time.perf_counter()
    trainer = Trainer(model, train, strategy)
    built = time.perf_counter() - started
    history = trainer.fit(data)
    later = history[1:] or history
    peaks = [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024]
    if ranks > 1:
        import torch.distributed as dist

        peaks = [0] * ranks
        dist.all_gather_object(peaks, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    row = {"mode": mode, "layers": layers, "width": width, "parameters": trainer.num_parameters(), "ranks": ranks,
           "peak_rss": max(peaks), "budget": budget,
           "build_seconds": built, "losses": [r["loss"] for r in history],
           "step_seconds": [r["step_seconds"] for r in history],
           "tokens_per_second": sum(r["tokens"] for r in later) / sum(r["step_seconds"] for r in later)}
    if mode == "chunks":
        row["read_per_step"] = [r["offload_read_bytes"] for r in history]
        row["written_per_step"] = [r["offload_written_bytes"] for r in history]
        row["read_ahead_per_step"] = [r["offload_read_ahead_bytes"] for r in history]
        row["chunk_bytes"] = list(trainer.chunks.layout.sizes)
    return row


def plain_torch(model, data, steps: int) -> dict:
    """The same training in a plain PyTorch loop (torch.optim.AdamW, the fused loss): the leanest
    in-memory peer."""
    import torch
    from torch.utils.data import default_collate

    from zoo.nn.logits import loss_only

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()
    losses, seconds = [], []
    for step in range(steps):
        started = time.perf_counter()
        total = 0.0
        for micro in range(2):
            batch = default_collate([data[(4 * step + 2 * micro + i) % len(data)] for i in range(2)])
            with loss_only():
                loss = model(**batch)["loss"]
            (loss / 2).backward()
            total += loss.item() / 2
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(total)
        seconds.append(time.perf_counter() - started)
    later = seconds[1:] or seconds
    return {"parameters": sum(p.numel() for p in model.parameters()), "losses": losses, "step_seconds": seconds,
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "build_seconds": 0.0,
            "tokens_per_second": 4 * BLOCK * len(later) / sum(later)}


def launch(mode: str, layers: int, width: int, steps: int, budget: int, directory: Path, ranks: int = 1) -> dict:
    """`run` in a fresh process, or in `ranks` under torchrun (its chunk files removed after)."""
    folder = Path(tempfile.mkdtemp(dir=directory))
    launcher = [sys.executable] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                    f"--nproc_per_node={ranks}"]
    environment = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1")) if ranks > 1 else None
    try:
        done = subprocess.run([*launcher, __file__, "--child", mode, "--layers", str(layers), "--width", str(width),
                               "--steps", str(steps), "--budget-bytes", str(budget), "--dir", str(folder)],
                              capture_output=True, text=True, env=environment)
        if done.returncode:
            return {"mode": mode, "layers": layers, "width": width, "ranks": ranks,
                    "error": done.stderr.strip().splitlines()[-1]}
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def describe(row: dict) -> str:
    if "error" in row:
        return f"| {row['mode']} x{row.get('ranks', 1)} | {row['layers']} x {row['width']} | failed: {row['error'][:120]} |"
    fits = "yes" if row["peak_rss"] <= row["budget"] else "no"
    traffic = ""
    mode = row["mode"] if row.get("ranks", 1) == 1 else f"{row['mode']}, {row['ranks']} ranks ZeRO-3"
    if row["mode"] == "chunks":
        floor = 12 * row["parameters"] / row.get("ranks", 1)
        read, written = row["read_per_step"][-1], row["written_per_step"][-1]
        traffic = f" {read / 2**30:.2f} / {written / 2**30:.2f} GiB ({read / floor:.2f}x / {written / floor:.2f}x floor)"
    return (f"| {mode} | {row['layers']} x {row['width']} | {row['parameters'] / 1e6:,.1f}M | "
            f"{16 * row['parameters'] / 2**30:.2f} GiB | {row['peak_rss'] / 2**30:.2f} GiB | {fits} | "
            f"{row['tokens_per_second']:,.1f} | {', '.join(f'{s:.1f}' for s in row['step_seconds'])} |{traffic} |")


def main() -> None:
    from trainers.estimate.devices import parse_bytes

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", default="2GiB", help="peak resident memory each run may reach")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--chunked", nargs="*", default=["24x1024"], help="LAYERSxWIDTH sizes trained with chunks")
    parser.add_argument("--dir", default=None, help="where chunk files go (default: a temporary folder)")
    parser.add_argument("--ranks", type=int, default=1, help="also train the --chunked sizes on this many ranks")
    parser.add_argument("--only-chunked", action="store_true", help="skip the in-memory ladders")
    parser.add_argument("--child", choices=("torch", "memory", "chunks"), help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--width", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--budget-bytes", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        row = run(args.child, args.layers, args.width, args.steps, args.budget_bytes, args.dir)
        if int(os.environ.get("RANK", "0")) == 0:
            print(json.dumps(row), flush=True)
        return
    budget = parse_bytes(args.budget, "--budget")
    directory = Path(args.dir or tempfile.mkdtemp(prefix="tiered-"))
    directory.mkdir(parents=True, exist_ok=True)
    print(f"budget {budget / 2**30:.2f} GiB peak RSS per process; {args.steps} steps of 4 x {BLOCK} tokens; "
          f"chunk files in {directory}; this launcher's peak RSS (which getrusage carries into the runs it "
          f"starts) {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")
    print("| states | layers x width | parameters | model states | peak RSS | fits | tokens/s (after step 1) | "
          "step seconds | disk read / written per step (last step) |")
    print("|---|---|---|---|---|---|---|---|---|")
    largest = {}
    for mode in () if args.only_chunked else ("torch", "memory"):
        for layers in range(1, 40):
            row = launch(mode, layers, WIDTH, args.steps, budget, directory)
            print(describe(row), flush=True)
            if "error" in row or row["peak_rss"] > budget:
                break
            largest[mode] = row
    sizes = [tuple(int(n) for n in size.split("x")) for size in args.chunked]
    sizes = sorted({(row["layers"], WIDTH) for row in largest.values()}) + sizes
    for layers, width in sizes:
        print(describe(launch("chunks", layers, width, args.steps, budget, directory)), flush=True)
    for layers, width in sizes[len(largest):] if args.ranks > 1 else ():
        print(describe(launch("chunks", layers, width, args.steps, budget, directory, args.ranks)), flush=True)


if __name__ == "__main__":
    main()
