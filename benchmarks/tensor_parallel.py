"""Memory and communication of tensor and sequence parallelism, per rank, for GPT at two sizes.

    python benchmarks/tensor_parallel.py [--ranks 1 2 4] [--out benchmarks/results/tensor_parallel.jsonl]

For each world size it launches torchrun (gloo on CPU; NCCL with MEMZOO_DEVICE=cuda on a machine
with a GPU per rank) running this file with --worker, which measures
for each layout that fits the world:
- model states at ZeRO-3 (parameters, gradients, AdamW state at rest: the trainer's memory report
  after 2 steps) beside one process's divided by dp x tp;
- saved activations of one block (bytes autograd keeps between its forward and backward, the
  project's SavedActivations; parameters excluded), with tp alone and with sequence parallelism,
  beside the zoo block's formula (below);
- collective payload bytes of one forward + backward (every c10d call this rank makes, by kind),
  beside the analytic volume of the layout.

The zoo pre-LN block keeps, per token, in fp32 (W width, F = 4W feed-forward, a heads):
  norm1 and norm2 outputs (2W, which the next linears save as their inputs: the same storage) and
  their rstd (2), q, k, v (3W), SDPA's output (W, the output projection's input), SDPA's
  log-sum-exp (a), fc1's output (F): 4 (6W + F + 2 + a) bytes = (40W + 8 + 4a) bytes at F = 4W.
With tp ranks the head and column shards divide: 4 (2W + 2 + (4W + F + a) / tp); with sequence
parallelism everything divides: 4 (6W + F + 2 + a) / tp (the regions' gathered inputs are given
back after forward and gathered again in backward). Megatron-LM's layer, in its own terms
(2-byte activations, its dropout masks and softmax kept), keeps 34 sbh + 5 a s^2 b bytes, with
tp alone sbh (10 + 24/t + 5as/(ht)), with sequence parallelism (34 sbh + 5 a s^2 b) / t.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from measure import finish_worker, launch_ranks, ranks_device  # noqa: E402

SIZES = {
    "gpt-3M": dict(vocab_size=4096, block_size=256, n_layer=4, n_head=8, n_embd=256),
    "gpt-13M": dict(vocab_size=4096, block_size=512, n_layer=4, n_head=8, n_embd=512),
}
BATCH = 4
"""Sequences per forward (of block_size tokens)."""


def analytic_collectives(shape: dict, tp: int, sequence_parallel: bool) -> dict[str, int]:
    """Expected payload bytes of one forward + backward of GPT `shape` on BATCH sequences at `tp`."""
    if tp == 1:
        return {}
    tokens, width, layers = BATCH * shape["block_size"], shape["n_embd"], shape["n_layer"]
    activation = 4 * tokens * width
    ce = 4 * tokens * 3 + 4 * tokens  # per chunk: the max, then (sum of exponentials, target, smoothing sum)
    if not sequence_parallel:
        # Per block: two region exits forward, two region entries backward; the embedding's sum
        # forward; the head's grad of the hidden states.
        return {"all_reduce": layers * 4 * activation + activation + ce + activation}
    norms = 4 * width * (2 * layers + 1)  # the norms' weight gradients (no biases in this GPT)
    return {
        # per block: two entries forward and their refills backward, the exits' backward; the
        # split after the embeddings (backward) and the gather before the head (forward)
        "all_gather": layers * 6 * activation + 2 * activation,
        "reduce_scatter": layers * 4 * activation,
        "all_reduce": activation + ce + activation + norms,
    }


def block_formula(shape: dict, tp: int, sequence_parallel: bool) -> int:
    """The zoo block's saved bytes (module docstring) for BATCH sequences."""
    tokens, width, heads = BATCH * shape["block_size"], shape["n_embd"], shape["n_head"]
    whole, split = 2 * width + 2, 4 * width + 4 * width + heads
    if sequence_parallel:
        return 4 * tokens * (whole + split) // tp
    return 4 * tokens * (whole + split // tp)


def tp_model(shape: dict, tp: int, sequence_parallel: bool):
    """GPT of `shape` split over the "tp" dimension of this job's mesh (no FSDP: only TP's traffic),
    the device it runs on and the parameters whose gradients a step sums over the ranks."""
    from nlp.gpt import GPT, GPTConfig
    from trainers.parallel.mesh import setup_distributed
    from trainers.parallel.tensor import PartialGradients, apply_tensor_parallel
    from zoo.plan import model_plan

    env = setup_distributed(tp)
    torch.manual_seed(0)
    model = GPT(GPTConfig(**shape, bias=False, dropout=0.0)).to(env.device)
    partial = PartialGradients([], None)
    if tp > 1:
        partial = apply_tensor_parallel(model, model_plan(model), env.mesh["tp"], sequence_parallel)
    return model, env.device, partial


def activations_and_traffic(shape: dict, tp: int, sequence_parallel: bool) -> dict:
    from torch.distributed.tensor import DTensor

    from trainers.estimate.counters import CollectiveLog
    from trainers.memory.saved_activations import SavedActivations
    from zoo.nn.logits import loss_only

    model, device, partial = tp_model(shape, tp, sequence_parallel)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, shape["vocab_size"], (BATCH, shape["block_size"]), generator=generator).to(device)
    params = [p.to_local() if isinstance(p, DTensor) else p for p in model.parameters()]
    saved = SavedActivations(exclude=params)
    block = model.blocks[0]

    def enter(*_) -> None:
        saved.__enter__()

    def leave(*_) -> None:
        saved.__exit__(None, None, None)

    block.register_forward_pre_hook(enter)
    block.register_forward_hook(leave)
    with CollectiveLog() as traffic, loss_only():
        model(ids, labels=ids)["loss"].backward()
        partial.sum()
    return {"block_saved_bytes": saved.bytes, "collective_bytes": traffic.bytes,
            "analytic_collective_bytes": analytic_collectives(shape, tp, sequence_parallel),
            "block_formula_bytes": block_formula(shape, tp, sequence_parallel)}


def model_states(shape: dict, tp: int) -> dict:
    from nlp.gpt import GPT, GPTConfig
    from trainers import Strategy, TrainConfig, Trainer

    torch.manual_seed(0)
    model = GPT(GPTConfig(**shape, bias=False, dropout=0.0))
    dp = int(os.environ.get("WORLD_SIZE", "1")) // tp
    config = TrainConfig(global_batch_size=2 * dp, micro_batch_size=2, max_steps=2, lr=1e-3, warmup_steps=1,
                         progress=False, output_dir="/tmp/memzoo-bench-tp")
    trainer = Trainer(model, config, Strategy(zero=3, tp=tp))
    generator = torch.Generator().manual_seed(2)
    data = [{"input_ids": ids, "labels": ids} for ids in
            torch.randint(0, shape["vocab_size"], (8 * dp, shape["block_size"]), generator=generator)]
    trainer.fit(data)
    report = trainer.memory_report()[0]
    return {key: report[key] for key in ("parameters", "gradients", "optimizer")}


def worker(out: str) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rows = []
    for size, shape in SIZES.items():
        for tp in (t for t in (1, 2, 4) if world % t == 0):
            states = model_states(shape, tp)
            for sequence_parallel in ((False, True) if tp > 1 else (False,)):
                if world == tp:  # activations and traffic of pure tensor parallelism
                    measured = activations_and_traffic(shape, tp, sequence_parallel)
                else:
                    measured = {}
                rows.append({"size": size, "world_size": world, "tp": tp, "dp": world // tp,
                             "sequence_parallel": sequence_parallel, **states, **measured})
    finish_worker(out, rows)


def tables(rows: list[dict]) -> str:
    mib = 2**20
    lines = []
    for size, shape in SIZES.items():
        mine = [r for r in rows if r["size"] == size]
        one = next((r for r in mine if r["world_size"] == 1), None)  # absent when --ranks leaves out 1
        one_states = one["parameters"] + one["gradients"] + one["optimizer"] if one else float("nan")
        lines += [f"### {size}: width {shape['n_embd']}, {shape['n_layer']} layers, {shape['n_head']} heads, "
                  f"vocabulary {shape['vocab_size']}, {BATCH} x {shape['block_size']} tokens", "",
                  "Model states per rank at ZeRO-3 (rank 0, MiB), beside one process's divided by dp x tp:", "",
                  "| ranks | dp x tp | parameters | gradients | optimizer | total | one process / (dp x tp) |",
                  "|---|---|---|---|---|---|---|"]
        for r in (r for r in mine if not r["sequence_parallel"]):
            total = r["parameters"] + r["gradients"] + r["optimizer"]
            lines.append(f"| {r['world_size']} | {r['dp']} x {r['tp']} | {r['parameters'] / mib:.2f} | "
                         f"{r['gradients'] / mib:.2f} | {r['optimizer'] / mib:.2f} | {total / mib:.2f} | "
                         f"{one_states / mib / r['world_size']:.2f} |")
        lines += ["", "Saved activations of one block per rank (MiB) and collective payload per forward + backward "
                  "(MiB, measured / analytic):", "",
                  "| tp | sequence parallel | block saved | formula | all-reduce | all-gather | reduce-scatter |",
                  "|---|---|---|---|---|---|---|"]
        for r in (r for r in mine if "block_saved_bytes" in r):
            cells = []
            for kind in ("all_reduce", "all_gather", "reduce_scatter"):
                got, want = r["collective_bytes"].get(kind, 0), r["analytic_collective_bytes"].get(kind, 0)
                cells.append(f"{got / mib:.2f} / {want / mib:.2f}" if got or want else "-")
            lines.append(f"| {r['tp']} | {'yes' if r['sequence_parallel'] else 'no'} | {r['block_saved_bytes'] / mib:.2f} | "
                         f"{r['block_formula_bytes'] / mib:.2f} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--out", default="benchmarks/results/tensor_parallel.jsonl")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.out)
        return
    started = time.time()
    rows = launch_ranks(__file__, args.ranks, args.out, [], {"MEMZOO_DEVICE": os.environ.get("MEMZOO_DEVICE", "cpu")})
    print(f"device: {ranks_device()}; torch {torch.__version__}; {time.time() - started:.0f} s\n")
    print(tables(rows))


if __name__ == "__main__":
    main()
