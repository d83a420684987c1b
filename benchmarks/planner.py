"""The planner's cost model against measured step times: does it rank layouts as they run?

    python benchmarks/planner.py [--ranks 2 4] [--out benchmarks/results/planner.jsonl] [--reuse-measured]
        [--device cpu|h100|a100]

For each world size it lists the layouts of a GPT (4 blocks, width 256, 256 tokens, global batch
16): ZeRO 0 and 3, recompute none and blocks, tensor-parallel degrees that divide the world, micro
batches of 4 and 2 examples (one data-parallel rank: ZeRO 0 only); and pipelined over 2 ranks (2
blocks a stage) under GPipe, 1F1B and zero-bubble, ZeRO 0, no recompute, micro batches of 4 and 2
(with tensor parallelism over the rest at 4 ranks); estimates each with the planner's
cost model on the "cpu" device measured here or a GPU preset (`trainers.estimate.planner.step_time` on the
traced step), and measures each: one torchrun launch (gloo with OMP_NUM_THREADS=1, or NCCL under
MEMZOO_DEVICE=cuda) trains every layout for 5 steps, the median of steps 3-5. It prints the device's
collective latency and bandwidth, predicted against measured seconds with each traced rank's FLOPs,
the Spearman rank correlation, and how far the planner's first choice is from the fastest measured.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from measure import finish_worker, launch_ranks, ranks_device  # noqa: E402

SHAPE = dict(vocab_size=4096, block_size=256, n_layer=4, n_head=8, n_embd=256)
GLOBAL_BATCH = 16
STEPS = 5


def layouts(world: int) -> list[tuple[dict, int]]:
    """(Strategy fields, micro-batch size) of every layout measured at `world` ranks."""
    result = []
    for tp in (t for t in (1, 2, 4) if world % t == 0):
        for zero in (0, 3) if world // tp > 1 else (0,):
            for recompute in ("none", "blocks"):
                for micro in (4, 2):
                    result.append((dict(zero=zero, recompute=recompute, tp=tp), micro))
    for schedule in ("gpipe", "1f1b", "zero_bubble"):
        for micro in (4, 2):
            result.append((dict(zero=0, recompute="none", tp=world // 2, pp=2, pp_schedule=schedule, pp_split=(2, 2)),
                           micro))
    return result


def label(fields: dict) -> str:
    """A layout's row label."""
    text = f"tp {fields['tp']} ZeRO {fields['zero']} recompute {fields['recompute']}"
    return text + (f" pp 2 {fields['pp_schedule']}" if fields.get("pp", 1) > 1 else "")


def _config(micro: int):  # noqa: ANN202
    from trainers import TrainConfig

    return TrainConfig(global_batch_size=GLOBAL_BATCH, micro_batch_size=micro, max_steps=STEPS, lr=1e-3, warmup_steps=1,
                       log_every=1, progress=False, output_dir="/tmp/memzoo-planner-bench")


def _batch(rows: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, SHAPE["vocab_size"], (rows, SHAPE["block_size"]), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids}


def worker(out: str) -> None:
    import torch.distributed as dist

    from nlp.gpt import GPT, GPTConfig
    from trainers import Strategy, Trainer
    from trainers.parallel.mesh import setup_distributed

    setup_distributed()
    world = dist.get_world_size()
    batch = _batch(GLOBAL_BATCH * 4)
    data = [{"input_ids": row, "labels": row} for row in batch["input_ids"]]
    rows = []
    for fields, micro in layouts(world):
        torch.manual_seed(0)
        trainer = Trainer(GPT(GPTConfig(**SHAPE)), _config(micro), Strategy(**fields))
        history = trainer.fit(data)
        seconds = statistics.median(record["step_seconds"] for record in history[2:])
        every: list[float] = [0.0] * world
        dist.all_gather_object(every, seconds)
        rows.append({"world": world, "fields": fields, "micro": micro, "measured": max(every)})
    finish_worker(out, rows)


def predictions(world: int, device: str) -> tuple[list[dict], object]:
    """Each layout's predicted seconds, traced peak and FLOPs per traced rank; and the device spec."""
    from nlp.gpt import GPT, GPTConfig
    from trainers import Strategy
    from trainers.estimate.devices import device_spec
    from trainers.estimate.trace import estimate_layouts
    from trainers.estimate.planner import step_time

    spec = device_spec(device, world)
    chosen = layouts(world)
    estimates = estimate_layouts(functools.partial(GPT, GPTConfig(**SHAPE)), _batch(4),
                                 [(Strategy(**fields), world, _config(micro)) for fields, micro in chosen])
    return [{"world": world, "fields": fields, "micro": micro, "predicted": step_time(estimate, spec).total,
             "peak": estimate.device_peak, "flops": [work.flops for work in estimate.work]}
            for (fields, micro), estimate in zip(chosen, estimates)], spec


def spearman(a: list[float], b: list[float]) -> float:
    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=values.__getitem__)
        result = [0.0] * len(values)
        for rank, index in enumerate(order):
            result[index] = float(rank)
        return result

    ra, rb = ranks(a), ranks(b)
    mean = (len(a) - 1) / 2
    cov = sum((x - mean) * (y - mean) for x, y in zip(ra, rb))
    var = sum((x - mean) ** 2 for x in ra)
    return cov / var


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--out", default="benchmarks/results/planner.jsonl")
    parser.add_argument("--reuse-measured", action="store_true",
                        help="predict again against the step times of the last run (OUT.measured.jsonl)")
    parser.add_argument("--device", default="cpu", help='the cost model\'s device: "cpu" measured here, or a preset')
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.out)
        return
    started = time.time()
    measured_file = Path(args.out).with_suffix(".measured.jsonl")
    if args.reuse_measured:
        measured = [json.loads(line) for line in measured_file.read_text().splitlines()]
    else:
        measured = launch_ranks(__file__, args.ranks, str(measured_file), [],
                                {"MEMZOO_DEVICE": os.environ.get("MEMZOO_DEVICE", "cpu")})
    Path(args.out).write_text("")
    print(f"device: {ranks_device()}; torch {torch.__version__}; {time.time() - started:.0f} s\n")
    for world in args.ranks:
        rows = {(json.dumps(r["fields"], sort_keys=True), r["micro"]): r for r in measured if r["world"] == world}
        table = []
        predicted, spec = predictions(world, args.device)
        print(f"{world} ranks, the cost model's device: {spec.name}, collectives {spec.latency * 1e3:.2f} ms a call and "
              f"{spec.node_bandwidth / 1e9:.2f} GB/s\n")
        for p in predicted:
            row = {**rows[json.dumps(p["fields"], sort_keys=True), p["micro"]], **p}
            table.append(row)
        print(f"| {world} ranks: layout | micro batch | predicted s | measured s | traced peak MiB | GFLOP of each "
              "traced rank |\n|---|---|---|---|---|---|")
        for r in sorted(table, key=lambda r: r["predicted"]):
            f = r["fields"]
            print(f"| {label(f)} | {r['micro']} | {r['predicted']:.3f} | "
                  f"{r['measured']:.3f} | {r['peak'] / 2**20:.1f} | {' / '.join(f'{flops / 1e9:.1f}' for flops in r['flops'])} |")
        rho = spearman([r["predicted"] for r in table], [r["measured"] for r in table])
        first = min(table, key=lambda r: r["predicted"])
        best = min(r["measured"] for r in table)
        print(f"\nSpearman {rho:.2f} over {len(table)} layouts; the planner's first choice measures "
              f"{first['measured'] / best:.2f}x the fastest\n")
        with open(args.out, "a") as sink:
            for row in table:
                sink.write(json.dumps({**row, "kind": "compared"}) + "\n")


if __name__ == "__main__":
    main()
