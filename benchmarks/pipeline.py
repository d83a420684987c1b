"""Pipeline schedules measured: step time, bubble, activation peak per rank, timelines, stage
balance, and breadth-first against depth-first data parallelism.

    python benchmarks/pipeline.py [--ranks 2 4] [--out benchmarks/results/pipeline.jsonl]
                                  [--timelines benchmarks/figures/pipeline]

For each world size P it launches torchrun (gloo on CPU; NCCL with MEMZOO_DEVICE=cuda and a GPU
per rank) running this file with --worker, which trains GPT (8 blocks, width 128, 8 heads, 4096
words, 128 tokens, 2 sequences a micro batch) at pp = P under each schedule (interleaved and
breadth-first with 2 stages per rank) for m = 2, 4, 8, 16 micro batches a step, 4 steps each:
- step time: the median of steps 3-4 (step 2 is the trainer's memory probe);
- measured bubble: each rank's idle time in the last step's pipeline run (the run's span, ended
  by the last rank to finish, less the rank's compute; waits for messages count as idle) over
  that span, averaged over ranks, beside the textbook one (`analytic_bubble`);
- activation peak per rank: the trainer's memory report (activations and backward temporaries
  alive at once during step 2): 1F1B holds at most p micro batches on the first rank, GPipe m;
- the timeline of the last run of m = 8, drawn to a PNG per schedule and world size.
With 4 ranks it also runs pp=2 x dp=2 at ZeRO-3 under 1F1B and looped BFS (m = 8) and counts each
rank's parameter all-gathers and gradient reduce-scatters per step, and the step time; and the
stage balance of a GPT with an 8192-word head at pp=2 (m = 8): each stage's measured compute per
step (its passes' times) under the split by measured costs and under the split by parameter
counts (the equal split for GPT).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from measure import finish_worker, launch_ranks, ranks_device  # noqa: E402

SHAPE = dict(vocab_size=4096, block_size=128, n_layer=8, n_head=8, n_embd=128)
BALANCE_VOCAB = 8192
"""The head of the balance run: it trains in about the time of 4 blocks."""
MICRO = 2
SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("looped_bfs", 2), ("zero_bubble", 1))
MICROBATCHES = (2, 4, 8, 16)
STEPS = 4
COLORS = {"F": (66, 133, 244), "B": (219, 68, 55), "I": (244, 160, 0), "W": (15, 157, 88)}


def token_examples(count: int, vocab: int) -> list[dict[str, torch.Tensor]]:
    ids = torch.randint(0, vocab, (count, SHAPE["block_size"]), generator=torch.Generator().manual_seed(1))
    return [{"input_ids": row, "labels": row} for row in ids]


def train(strategy, microbatches: int, vocab: int = SHAPE["vocab_size"], balanced: bool = True):
    """A trainer of GPT `SHAPE` (with `vocab` words) after STEPS steps of `microbatches` micro batches
    per data-parallel rank, and its history."""
    from nlp.gpt import GPT, GPTConfig
    from trainers import TrainConfig, Trainer
    from trainers.loop.data import first_micro_batch

    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**SHAPE, "vocab_size": vocab}, bias=False, dropout=0.0))
    data = token_examples(256, vocab)
    dp = int(os.environ["WORLD_SIZE"]) // (strategy.pp * strategy.tp)
    config = TrainConfig(global_batch_size=MICRO * microbatches * dp, micro_batch_size=MICRO, max_steps=STEPS,
                         lr=1e-3, warmup_steps=1, log_every=1, progress=False, output_dir="/tmp/memzoo-bench-pipeline")
    trainer = Trainer(model, config, strategy, example_batch=first_micro_batch(data, MICRO) if balanced else None)
    return trainer, trainer.fit(data), data


def gathered_timeline(trainer) -> list[dict]:
    """Every rank's last pipeline run: {"rank", "began", "spans": [(kind, stage, micro, start, end, waited)]}."""
    import torch.distributed as dist

    mine = {"rank": dist.get_rank(), "began": trainer.pipeline.run_began,
            "spans": [(s.action.kind, s.action.stage, s.action.micro, s.start, s.end, s.waited)
                      for s in trainer.pipeline.timeline]}
    every: list[dict] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(every, mine)
    return every


def bubble(timelines: list[dict]) -> tuple[float, float]:
    """(mean idle fraction over ranks, span in seconds) of one run: the span runs from the first
    rank's start to the last rank's end; a rank's compute is its actions' time less their waits."""
    first = min(t["began"] for t in timelines)
    last = max(t["began"] + t["spans"][-1][4] for t in timelines)
    span = last - first
    idle = [span - sum(end - start - waited for *_, start, end, waited in t["spans"]) for t in timelines]
    return sum(i / span for i in idle) / len(idle), span


def stage_compute(timelines: list[dict]) -> dict[int, float]:
    """Seconds of compute of each stage in one run (its passes' time less their waits)."""
    totals: dict[int, float] = {}
    for t in timelines:
        for _, stage, _, start, end, waited in t["spans"]:
            totals[stage] = totals.get(stage, 0.0) + end - start - waited
    return totals


def draw(timelines: list[dict], path: Path, title: str) -> None:
    """A PNG of the run: one row per rank, one box per pass (forward blue, backward red, input
    gradient orange, weight gradient green), labelled with its micro batch and stage."""
    from PIL import Image, ImageDraw

    first = min(t["began"] for t in timelines)
    span = max(t["began"] + t["spans"][-1][4] for t in timelines) - first
    width, row, left, top = 1400, 46, 70, 30
    image = Image.new("RGB", (width + left + 10, top + row * len(timelines) + 10), "white")
    pen = ImageDraw.Draw(image)
    pen.text((left, 8), f"{title}: {span * 1e3:.0f} ms; box = pass on (micro batch / stage), grey = waiting", fill="black")
    scale = width / span
    for index, t in enumerate(sorted(timelines, key=lambda t: t["rank"])):
        y = top + index * row
        pen.text((6, y + 15), f"rank {t['rank']}", fill="black")
        for kind, stage, micro, start, end, waited in t["spans"]:
            x0 = left + (t["began"] - first + start) * scale
            x_compute = x0 + waited * scale
            x1 = left + (t["began"] - first + end) * scale
            if waited > 0:
                pen.rectangle([x0, y + 4, x_compute, y + row - 8], fill=(225, 225, 225))
            pen.rectangle([x_compute, y + 4, max(x1, x_compute + 1), y + row - 8], fill=COLORS[kind], outline="white")
            if x1 - x_compute > 26:
                pen.text((x_compute + 3, y + 13), f"{micro}/{stage}", fill="white")
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)


def collectives_per_step(trainer, data) -> dict[str, int]:
    """Count of this rank's parameter all-gathers and gradient reduce-scatters in one more step."""
    from trainers.estimate.counters import CollectiveLog

    trainer.config = dataclasses.replace(trainer.config, max_steps=trainer.step + 1)
    with CollectiveLog() as counting:
        started = time.perf_counter()
        trainer.fit(data)
        seconds = time.perf_counter() - started
    return {"all_gathers": counting.calls.get("all_gather", 0),
            "reduce_scatters": counting.calls.get("reduce_scatter", 0), "step_seconds": seconds}


def worker(out: str, timelines: str) -> None:
    import torch.distributed as dist

    from trainers import Strategy
    from trainers.pipeline.schedules import analytic_bubble
    from trainers.pipeline.balance import stage_costs

    world = int(os.environ["WORLD_SIZE"])
    rows = []
    for name, stages_per_rank in SCHEDULES:
        for m in MICROBATCHES:
            if name == "interleaved_1f1b" and m % world:
                continue
            strategy = Strategy(pp=world, pp_schedule=name, stages_per_rank=stages_per_rank)
            trainer, history, _ = train(strategy, m)
            every = gathered_timeline(trainer)
            measured, span = bubble(every)
            if m == 8 and dist.get_rank() == 0:
                draw(every, Path(timelines) / f"{name}_pp{world}.png",
                     f"{name}, pp={world}, {stages_per_rank} stage(s) a rank, m=8")
            rows.append({"kind": "schedule", "world_size": world, "schedule": name, "stages_per_rank": stages_per_rank,
                         "microbatches": m, "step_seconds": statistics.median(r["step_seconds"] for r in history[2:]),
                         "pipeline_seconds": span, "bubble": measured,
                         "analytic_bubble": analytic_bubble(name, world, stages_per_rank, m),
                         "activation_peak": [r["activation_peak"] for r in trainer.memory_report()]})
    if world == 2:
        for balanced in (True, False):
            trainer, _, _ = train(Strategy(pp=2), 8, vocab=BALANCE_VOCAB, balanced=balanced)
            compute = stage_compute(gathered_timeline(trainer))
            layout = trainer.pipeline_parts.layout
            rows.append({"kind": "balance", "split": "measured costs" if balanced else "parameter counts",
                         "blocks": [len(r) for r in layout.ranges], "stage_seconds": [compute[s] for s in sorted(compute)],
                         "estimated": stage_costs(layout.costs, layout.ranges)})
    if world == 4:
        for name, stages_per_rank in (("1f1b", 1), ("looped_bfs", 1), ("looped_bfs", 2)):
            strategy = Strategy(pp=2, pp_schedule=name, stages_per_rank=stages_per_rank, zero=3)
            trainer, _, data = train(strategy, 8)
            counts = collectives_per_step(trainer, data)
            every: list[dict] = [{} for _ in range(world)]
            dist.all_gather_object(every, counts)
            rows.append({"kind": "data_parallel", "schedule": name, "stages_per_rank": stages_per_rank,
                         "per_rank": every})
    finish_worker(out, rows)


def tables(rows: list[dict]) -> str:
    mib = 2**20
    lines = ["| pp | schedule | stages a rank | m | step s | pipeline s | bubble measured | bubble analytic | "
             "activation peak per rank MiB |", "|---|---|---|---|---|---|---|---|---|"]
    for r in (r for r in rows if r["kind"] == "schedule"):
        peaks = " / ".join(f"{p / mib:.1f}" for p in r["activation_peak"])
        lines.append(f"| {r['world_size']} | {r['schedule']} | {r['stages_per_rank']} | {r['microbatches']} | "
                     f"{r['step_seconds']:.3f} | {r['pipeline_seconds']:.3f} | {r['bubble']:.2f} | "
                     f"{r['analytic_bubble']:.2f} | {peaks} |")
    lines += ["", "| split by | blocks per stage | its cost per stage (s or parameters) | measured compute s per stage | "
              "slowest / mean |",
              "|---|---|---|---|---|"]
    for r in (r for r in rows if r["kind"] == "balance"):
        seconds = r["stage_seconds"]
        lines.append(f"| {r['split']} | {' + '.join(map(str, r['blocks']))} | "
                     f"{' / '.join(f'{c:.3g}' for c in r['estimated'])} | {' / '.join(f'{s:.3f}' for s in seconds)} | "
                     f"{max(seconds) / statistics.mean(seconds):.3f} |")
    lines += ["", "| pp2 x dp2 ZeRO-3 | stages a rank | all-gathers per step (rank 0 / 2) | reduce-scatters per step "
              "(rank 0 / 2) | step s |", "|---|---|---|---|---|"]
    for r in (r for r in rows if r["kind"] == "data_parallel"):
        ranks = r["per_rank"]
        lines.append(f"| {r['schedule']} | {r['stages_per_rank']} | {ranks[0]['all_gathers']} / {ranks[2]['all_gathers']} | "
                     f"{ranks[0]['reduce_scatters']} / {ranks[2]['reduce_scatters']} | "
                     f"{max(x['step_seconds'] for x in ranks):.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--out", default="benchmarks/results/pipeline.jsonl")
    parser.add_argument("--timelines", default="benchmarks/figures/pipeline")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.out, args.timelines)
        return
    started = time.time()
    rows = launch_ranks(__file__, args.ranks, args.out, ["--timelines", args.timelines],
                        {"MEMZOO_DEVICE": os.environ.get("MEMZOO_DEVICE", "cpu")})
    print(f"device: {ranks_device()}; torch {torch.__version__}; {time.time() - started:.0f} s\n")
    print(tables(rows))


if __name__ == "__main__":
    main()
