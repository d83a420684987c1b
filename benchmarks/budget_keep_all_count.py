"""How close the memory budget's count of "keep everything, chunked" is to its trace
(`trainers.estimate.budget.KEEP_ALL_SLACK`): the count is full recompute's traced peak plus every operator
output's bytes (what the knapsack weighs); the trace is the step that keeps everything, with the
same chunks.

    python benchmarks/budget_keep_all_count.py [--blocks 6 8]

The case is tests/trainers/test_memory_budget.py's Evoformer (64-residue chains cropped to 48, 8
MSA rows, default widths) at a quarter of its traced unconstrained peak, chunks of budget / 16 as
the ladder sets them; one process traces everything (`trainers.estimate.process`).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch

from protein.data import CropConfig, FoldingExamples, collate_folding, load_chains
from protein.evoformer import EvoformerConfig
from protein.model import FoldConfig, FoldingModel
from trainers import Strategy, TrainConfig
from trainers.estimate.budget import MIN_CHUNK_BYTES, PLANNING_MARGIN
from trainers.loop.data import first_micro_batch
from trainers.estimate.trace import layout_job, trace_jobs
from trainers.estimate.process import run_fresh


def measure(blocks: int) -> dict[str, float]:
    """MiB of the unconstrained trace, full recompute, the count and the keep-everything trace."""
    torch.manual_seed(0)
    chains = [chain for chain in load_chains("train") if len(chain.sequence) >= 48][:4]
    data = FoldingExamples(chains, CropConfig(crop_size=48, msa_rows=8, withhold_profile=0.0))
    model = FoldingModel(FoldConfig(evoformer=EvoformerConfig(blocks=blocks), max_recycles=0))
    batch = first_micro_batch(data, 1, collate_folding)
    job = layout_job(Strategy(), 1, TrainConfig(global_batch_size=1, micro_batch_size=1), 1)
    free = trace_jobs(model, batch, [replace(job, keep="all")])[0].peak
    chunk = max(MIN_CHUNK_BYTES, int(free // 4 * (1 - PLANNING_MARGIN)) // 16)
    floor, everything = trace_jobs(model, batch, [replace(job, keep="inputs", chunk_bytes=chunk, profile=True),
                                                  replace(job, keep="all", chunk_bytes=chunk)])
    count = floor.peak + sum(cost.bytes for costs in floor.block_ops.values() for cost in costs)
    return {name: value / 2**20 for name, value in
            (("unconstrained", free), ("full recompute", floor.peak), ("count", count),
             ("keep everything, chunked", everything.peak), ("chunk", chunk))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[6, 8])
    args = parser.parse_args()
    print("| Evoformer blocks | unconstrained | full recompute | count | keep everything, chunked | count / trace | chunk |")
    print("|---|---|---|---|---|---|---|")
    for blocks in args.blocks:
        row = run_fresh(measure, blocks)
        print(f"| {blocks} | {row['unconstrained']:.1f} | {row['full recompute']:.1f} | {row['count']:.1f} | "
              f"{row['keep everything, chunked']:.1f} | {row['count'] / row['keep everything, chunked']:.3f} | "
              f"{row['chunk']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
