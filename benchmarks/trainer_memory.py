"""Per-rank memory and step time of the trainer for every ZeRO stage and offload mode.

    python benchmarks/trainer_memory.py [--ranks 1 2 4] [--steps 4] [--out BENCH.jsonl]

For each world size it launches torchrun (gloo; NCCL on GPUs) running this file with --worker,
which trains two GPT sizes under each strategy for a few steps and records the trainer's measured
memory report (parameters, gradients, optimizer state, activation peak: live tensors on CPU,
CUDA allocator stats on GPU), the median step time, and the ZeRO-paper estimate. The driver
prints one markdown table per model size. Where DeepSpeed imports, the same model and batches run
under DeepSpeed ZeRO in the same worker (`deepspeed_peer.py`), and both frameworks' model states
at rest are also measured by one census of live tensor storages (the `census` columns).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from measure import launch_ranks  # noqa: E402

SIZES = {
    "gpt-5M": dict(vocab_size=8192, block_size=128, n_layer=4, n_head=4, n_embd=256),
    "gpt-30M": dict(vocab_size=8192, block_size=128, n_layer=8, n_head=8, n_embd=512),
}
STRATEGIES = [(zero, offload) for zero in (0, 1, 2, 3) for offload in ("none", "optimizer", "params")]


def deepspeed_rows(size: str, shape: dict, data: list[dict], steps: int) -> list[dict]:
    """The DeepSpeed peer's rows (none where DeepSpeed does not import)."""
    try:
        import deepspeed_peer
    except ImportError:
        return []
    from nlp.gpt import GPT, GPTConfig

    world = int(os.environ.get("WORLD_SIZE", "1"))
    batches = [{k: torch.stack([e[k] for e in data[i * 4 : i * 4 + 4]]) for k in data[0]} for i in range(steps)]
    rows = []
    for zero, offload in STRATEGIES:
        if deepspeed_peer.supported(zero, offload):
            torch.manual_seed(0)
            result = deepspeed_peer.run(lambda: GPT(GPTConfig(**shape)), batches, zero, offload)
            rows.append({"framework": "deepspeed", "size": size, "world_size": world, "zero": zero, "offload": offload, **result})
    return rows


def worker(steps: int, out: str) -> None:
    import torch.distributed as dist

    from nlp.gpt import GPT, GPTConfig
    from trainers import Strategy, TrainConfig, Trainer, zero_model_states
    from trainers.memory.measure import live_tensor_bytes

    rows = []
    for size, shape in SIZES.items():
        generator = torch.Generator().manual_seed(0)
        data = [{"input_ids": x, "labels": x}
                for x in torch.randint(0, shape["vocab_size"], (64, shape["block_size"]), generator=generator)]
        for zero, offload in STRATEGIES:
            strategy = Strategy(zero=zero, offload=offload)
            before = sum(live_tensor_bytes().values())
            torch.manual_seed(0)
            model = GPT(GPTConfig(**shape))
            numel = model.num_parameters()
            world = int(os.environ.get("WORLD_SIZE", "1"))
            config = TrainConfig(global_batch_size=4 * world, micro_batch_size=4, max_steps=steps, log_every=1,
                                 progress=False, output_dir=tempfile.mkdtemp(prefix="bench-"))
            trainer = Trainer(model, config, strategy)
            history = trainer.fit(data)
            census = sum(live_tensor_bytes().values()) - before
            seconds = statistics.median(r["step_seconds"] for r in history[2:]) if len(history) > 2 else history[-1]["step_seconds"]
            if dist.get_rank() == 0:
                for report in trainer.memory_report():
                    rows.append({"framework": "memzoo", "census_bytes": census, "size": size, "params": numel, "world_size": world, "zero": zero, "offload": offload,
                                 "step_seconds": seconds, **{k: v for k, v in report.items() if k != "by_device"},
                                 "estimate": zero_model_states(numel, strategy, world)})
            del trainer, model
        rows.extend(deepspeed_rows(size, shape, data, steps))
    if dist.get_rank() == 0:
        with open(out, "a") as handle:
            for row in rows:
                handle.write(json.dumps(row) + "\n")


def table(rows: list[dict], size: str) -> str:
    mib = 2**20
    ours = [r for r in rows if r["framework"] == "memzoo"]
    peers = {(r["world_size"], r["zero"], r["offload"]): r for r in rows if r["framework"] == "deepspeed"}
    lines = [f"### {size} ({ours[0]['params'] / 1e6:.1f} M parameters), rank 0, MiB",
             "",
             "| ranks | zero | offload | params | grads | optimizer | other | activation peak | model states | ZeRO paper "
             "| census | DeepSpeed census | step s | DeepSpeed step s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in ours:
        states = r["parameters"] + r["gradients"] + r["optimizer"] + r["other"]
        peer = peers.get((r["world_size"], r["zero"], r["offload"]))
        peer_census = f"{peer['census_bytes'] / mib:.1f}" if peer else "-"
        peer_seconds = f"{peer['step_seconds']:.3f}" if peer else "-"
        lines.append(f"| {r['world_size']} | {r['zero']} | {r['offload']} | {r['parameters'] / mib:.1f} | {r['gradients'] / mib:.1f} | "
                     f"{r['optimizer'] / mib:.1f} | {r['other'] / mib:.1f} | {r['activation_peak'] / mib:.1f} | {states / mib:.1f} | "
                     f"{r['estimate']['total'] / mib:.1f} | {r['census_bytes'] / mib:.1f} | {peer_census} | "
                     f"{r['step_seconds']:.3f} | {peer_seconds} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", default="benchmarks/results/trainer_memory.jsonl")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.steps, args.out)
        return
    started = time.time()
    rows = launch_ranks(__file__, args.ranks, args.out, ["--steps", str(args.steps)])
    rows = [r for r in rows if r.get("rank", 0) == 0]
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"
    print(f"device: {device}; torch {torch.__version__}; {time.time() - started:.0f} s\n")
    for size in SIZES:
        print(table([r for r in rows if r["size"] == size], size) + "\n")


if __name__ == "__main__":
    main()
