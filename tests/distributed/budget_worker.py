"""Training under a memory budget on several gloo ranks, for tests/distributed/test_budget_on_ranks.py
(run as worker.py's "budget" command in the shared launch).

    budget_worker.py OUT LAYOUT ...   each LAYOUT trains 2 steps unconstrained, then 2 steps under
                                      a budget; per layout the budget, both loss histories, the
                                      measured peaks, the plan and its strategy, to OUT:
      pp   a deep narrow GPT (8 blocks of width 32) pipelined over 2 ranks in stages of (4, 4)
           blocks (1F1B, 2 micro batches of 16 a step), at two fifths of its largest measured
           peak: between the traced peaks of full recompute and of keeping everything, so the
           knapsack picks what to keep. The split is given: a split balanced by measured
           times may differ between machines, and with it the peak the budget is a share of;
      dp   a wide shallow GPT (2 blocks of width 256) data-parallel from ZeRO 0 (a micro batch of
           2 a rank), at 85% of its largest measured peak: its model states alone outweigh the
           rest, so no recompute or chunking fits at ZeRO 0.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[1])]

from helpers import shakespeare_gpt  # noqa: E402
from trainers import Strategy, TrainConfig, Trainer  # noqa: E402
from trainers.loop.data import first_micro_batch  # noqa: E402
from trainers.parallel.mesh import exit_process, shutdown_distributed  # noqa: E402

CASES = {"pp": dict(n_layer=8, rows=16), "dp": dict(n_layer=2, n_embd=256, block_size=32, rows=2)}


def train(layout: str, budget: int | None) -> tuple[Trainer, list[dict]]:
    build, data, collate, rows = shakespeare_gpt(**CASES[layout])
    world = int(os.environ["WORLD_SIZE"])
    pipelined = layout == "pp"
    config = TrainConfig(global_batch_size=2 * rows if pipelined else rows * world, micro_batch_size=rows, max_steps=2,
                         lr=1e-3, warmup_steps=1, log_every=1, progress=False, output_dir=f"/tmp/memzoo-budget-{layout}")
    strategy = (Strategy(pp=world, pp_split=(4, 4), memory_budget=budget) if pipelined
                else Strategy(zero=0, memory_budget=budget))
    torch.manual_seed(0)
    trainer = Trainer(build(), config, strategy, example_batch=first_micro_batch(data, rows, collate))
    return trainer, trainer.fit(data, collate_fn=collate)


def main(out: str, *layouts: str) -> None:
    results = {}
    for layout in layouts:
        free, free_history = train(layout, None)
        reports = free.memory_report()
        peak = max(report["peak"] for report in reports)
        budget = peak * 2 // 5 if layout == "pp" else peak * 17 // 20
        held, history = train(layout, budget)
        results[layout] = {"budget": budget, "free": [r["loss"] for r in free_history],
                           "held": [r["loss"] for r in history], "peaks": [r["measured_peak_bytes"] for r in history],
                           "plan": held.budget.plan.describe(), "planned_peak": held.budget.plan.peak,
                           "strategy": held.strategy, "tried": held.budget.plan.tried}
    if dist.get_rank() == 0:
        torch.save(results, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
    shutdown_distributed()
    exit_process(0)
