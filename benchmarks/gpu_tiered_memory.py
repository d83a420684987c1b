"""The largest GPT that trains under a fixed GPU memory budget, and throughput at equal size: model
states in chunks across GPU, pinned host memory and disk (`Strategy(offload="chunks")`, the device
tier of `trainers.memory.chunks.device`) against FSDP2's static CPU offload (`Strategy(zero=3,
offload="params")`: every parameter on the host, each block copied up for its forward and backward,
every gradient down, the update on the host) and against plain training with the states on the GPU.

Each run is a fresh process on one GPU whose caching allocator is capped at the budget
(torch.cuda.set_per_process_memory_fraction; every mode with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True),
training GPT (GPT-2's vocabulary, 128-token blocks
of Shakespeare, 2 micro batches of 2, fp32, built on the meta device) for a few steps. A size
fits when its run finishes; the GPU peak is torch.cuda.max_memory_allocated. Each mode climbs the
--layers ladder at --width until a size fails (or its run passes --run-timeout). Chunked runs
also report the bytes copied up to and down from the GPU per step, the chunks updated on the GPU
(the rest on the host), and disk traffic (none while host memory holds the states).

With --device cpu (a machine without a GPU; chunked runs only) the device tier is a pool of host
memory under the budget: the bytes each step moves between the tiers and where the updates run
are those a GPU of that budget would see, the times are not.

    python benchmarks/gpu_tiered_memory.py [--budget 4GiB] [--width 1024] [--layers 4 8 16 32 48]
        [--steps 3] [--host-budget 96GiB] [--device cuda|cpu] [--out FILE.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiered_memory import BLOCK, gpt_and_data  # noqa: E402

from trainers.loop.metrics import METRICS_FILE  # noqa: E402

MODES = ("gpu", "fsdp-offload", "chunks")
"""States on the GPU; FSDP2 static CPU offload; chunks in three tiers."""


def run(mode: str, layers: int, width: int, steps: int, budget: int, host_budget: int, directory: str,
        device_type: str) -> dict:
    """Train one GPT in this process under the device budget; its figures."""
    import torch

    from trainers import Strategy, TrainConfig, Trainer

    device, on_gpu = torch.device(device_type), device_type == "cuda"
    if on_gpu:
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget / torch.cuda.get_device_properties(device).total_memory))
    model, data = gpt_and_data(layers, width, meta=True)
    strategy = {"gpu": Strategy(), "fsdp-offload": Strategy(zero=3, offload="params"),
                "chunks": Strategy(offload="chunks", offload_dir=directory, memory_budget=host_budget,
                                   device_memory_budget=budget)}[mode]
    train = TrainConfig(max_steps=steps, global_batch_size=4, micro_batch_size=2, lr=1e-4, warmup_steps=1,
                        log_every=1, progress=False, output_dir=str(Path(directory) / "out"))
    started = time.perf_counter()
    trainer = Trainer(model, train, strategy)
    built = time.perf_counter() - started
    if on_gpu:
        torch.cuda.reset_peak_memory_stats(device)
    try:
        history = trainer.fit(data)
    except torch.OutOfMemoryError:
        if not on_gpu:
            raise
        traceback.print_exc()
        print(f"allocator state at step {trainer.step + 1}: {json.dumps(allocator_state(device))}", file=sys.stderr)
        raise SystemExit(1)
    later = history[1:] or history
    row = {"mode": mode, "layers": layers, "width": width, "parameters": trainer.num_parameters(), "budget": budget,
           "device": device_type, "peak_allocated": torch.cuda.max_memory_allocated(device) if on_gpu else None,
           "peak_reserved": torch.cuda.max_memory_reserved(device) if on_gpu else None, "build_seconds": built,
           "losses": [r["loss"] for r in history], "step_seconds": [r["step_seconds"] for r in history],
           "tokens_per_second": sum(r["tokens"] for r in later) / sum(r["step_seconds"] for r in later)}
    if mode == "chunks":
        for key in ("device_up_bytes", "device_down_bytes", "device_up_ahead_bytes", "device_updated_chunks",
                    "host_updated_chunks", "offload_read_bytes", "offload_written_bytes", "device_allocated_chunks",
                    "device_out_of_memory_retries", "device_step_reruns"):
            row[key] = [r[key] for r in history]
        row["allocator_slack"] = trainer.chunks.allocator_slack
    return row


def allocator_state(device) -> dict:
    """Where the caching allocator's memory is, per stream and kind of segment: bytes reserved and
    allocated, the free blocks and the largest of them (what an allocation that failed could not use)."""
    import torch

    state: dict[str, dict] = {}
    for segment in torch.cuda.memory_snapshot():
        if segment["device"] != device.index and device.index is not None:
            continue
        name = f"stream {segment['stream']} {segment['segment_type']}{' expandable' if segment.get('is_expandable') else ''}"
        row = state.setdefault(name, {"segments": 0, "reserved": 0, "allocated": 0, "free_blocks": 0, "largest_free": 0})
        row["segments"] += 1
        row["reserved"] += segment["total_size"]
        row["allocated"] += segment["allocated_size"]
        for block in segment["blocks"]:
            if block["state"] == "inactive":
                row["free_blocks"] += 1
                row["largest_free"] = max(row["largest_free"], block["size"])
    stats = torch.cuda.memory_stats(device)
    state["totals"] = {key: stats.get(key, 0) for key in ("reserved_bytes.all.current", "allocated_bytes.all.current",
                                                         "inactive_split_bytes.all.current", "num_alloc_retries",
                                                         "num_ooms")}
    return state


def launch(mode: str, layers: int, args: argparse.Namespace, budget: int, host_budget: int, directory: Path) -> dict:
    """`run` in a fresh process (its chunk files removed after)."""
    folder = Path(tempfile.mkdtemp(dir=directory))
    command = [sys.executable, __file__, "--child", mode, "--layers", str(layers), "--width", str(args.width),
               "--steps", str(args.steps), "--budget-bytes", str(budget), "--host-budget-bytes", str(host_budget),
               "--dir", str(folder), "--device", args.device]
    failed = {"mode": mode, "layers": layers, "width": args.width}
    try:
        # Every mode with expandable segments: the cap is on the allocator's reserved memory, and chunks,
        # gradients and activations of many sizes otherwise strand hundreds of MiB between them.
        env = os.environ | {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.run_timeout, env=env)
        if done.returncode:
            lines = done.stderr.strip().splitlines() or ["no output"]
            state = next((line for line in lines if line.startswith("allocator state")), None)
            return failed | {"error": next((line for line in reversed(lines) if "Error" in line), lines[-1]),
                             "stderr_tail": done.stderr[-4000:], "allocator_state": state}
        return json.loads(done.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        # The steps it finished, from the Trainer's metrics file, so that a long run stopped still says how far it got.
        metrics = folder / "out" / METRICS_FILE
        steps = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
        seconds = ", ".join(f"{record['step_seconds']:.2f}" for record in steps) or "none"
        losses = ", ".join(f"{record['loss']:.4f}" for record in steps) or "none"
        return failed | {"error": f"over --run-timeout {args.run_timeout} s after {len(steps)} of {args.steps} steps "
                                  f"(step seconds {seconds}; losses {losses})"}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def describe(row: dict) -> str:
    if "error" in row:
        return f"| {row['mode']} | {row['layers']} x {row['width']} | failed: {row['error'][:300]} |"
    moves = ""
    if row["mode"] == "chunks":
        up, down = row["device_up_bytes"][-1], row["device_down_bytes"][-1]
        on_gpu = row["device_updated_chunks"][-1]
        chunks = on_gpu + row["host_updated_chunks"][-1]
        moves = (f" {up / 2**30:.2f} / {down / 2**30:.2f} GiB up / down, {on_gpu} of {chunks} chunks updated on the GPU, "
                 f"disk {row['offload_read_bytes'][-1] / 2**30:.2f} / {row['offload_written_bytes'][-1] / 2**30:.2f} GiB, "
                 f"{row['device_allocated_chunks'][-1]} buffers allocated, "
                 f"{sum(row['device_out_of_memory_retries'])} out-of-memory retries and "
                 f"{sum(row['device_step_reruns'])} steps run again in all, allocator slack "
                 f"{row['allocator_slack'] / 2**20:.0f} MiB at the end")
    peak = "-" if row["peak_allocated"] is None else f"{row['peak_allocated'] / 2**30:.2f} GiB"
    return (f"| {row['mode']} | {row['layers']} x {row['width']} | {row['parameters'] / 1e6:,.1f}M | "
            f"{16 * row['parameters'] / 2**30:.2f} GiB | {peak} | "
            f"{row['tokens_per_second']:,.1f} | {', '.join(f'{s:.2f}' for s in row['step_seconds'])} |{moves} |")


def main() -> None:
    from trainers.estimate.devices import parse_bytes

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", default="4GiB", help="device memory each run may allocate")
    parser.add_argument("--host-budget", default="96GiB", help="the chunked runs' process memory budget")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 8, 16, 32, 48])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--run-timeout", type=float, default=150.0, help="seconds a run may take")
    parser.add_argument("--dir", default=None, help="where chunk files go (default: a temporary folder)")
    parser.add_argument("--out", default=None, help="also append each run's figures to this JSON-lines file")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the device tier a pool of host memory (chunked runs only; bytes, not times)")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--budget-bytes", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--host-budget-bytes", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        row = run(args.child, args.layers[0], args.width, args.steps, args.budget_bytes, args.host_budget_bytes,
                  args.dir, args.device)
        print(json.dumps(row), flush=True)
        return
    budget, host_budget = parse_bytes(args.budget, "--budget"), parse_bytes(args.host_budget, "--host-budget")
    if args.device == "cpu" and args.modes != ["chunks"]:
        parser.error(f"--device cpu runs --modes chunks only (the others need a GPU); got --modes {' '.join(args.modes)}")
    directory = Path(args.dir or tempfile.mkdtemp(prefix="gpu-tiered-"))
    directory.mkdir(parents=True, exist_ok=True)
    print(f"{args.device} budget {budget / 2**30:.2f} GiB (allocator capped on a GPU); {args.steps} steps of 4 x {BLOCK} tokens, fp32; "
          f"chunked runs: {host_budget / 2**30:.0f} GiB process budget, files in {directory}")
    print("| states | layers x width | parameters | model states | GPU peak allocated | tokens/s (after step 1) | "
          "step seconds | chunks: GPU traffic per step (last step) |")
    print("|---|---|---|---|---|---|---|---|")
    for mode in args.modes:
        for layers in args.layers:
            row = launch(mode, layers, args, budget, host_budget, directory)
            print(describe(row), flush=True)
            if args.out:
                with open(args.out, "a") as sink:
                    sink.write(json.dumps(row) + "\n")
            if "error" in row:
                break


if __name__ == "__main__":
    main()
