"""Dynamic axial parallelism of the Evoformer: memory and traffic per rank against crop length.

    python benchmarks/axial_parallel.py [--ranks 1 2 4] [--crops 64 128] [--rows 8]

For each world size it launches torchrun (gloo) running this file with --worker, which splits
fold_tiny's model (4 Evoformer blocks, widths 32/32) over all ranks with `Strategy.tp` = world
(`trainers.parallel.tensor` applying the plan's `axial` Evoformer; no FSDP, so every collective
counted is axial parallelism's) and runs one training step (recycles=0) per crop, measuring on
rank 0:
- Evoformer saved: bytes autograd keeps for the Evoformer's backward (the project's
  SavedActivations, parameters excluded);
- step peak: tensor bytes created by the step alive at once (`TensorPeak`), gradients included;
- traffic: collective payloads of the step by kind (all-gather: the gathered output; all-to-all:
  what is sent; all-reduce: the tensor), the parameters' gradient sums included.
The rest of the model (embedding, structure module, losses) is whole on every rank.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from fold_memory import inputs  # noqa: E402
from measure import finish_worker, launch_ranks  # noqa: E402
from trainers.estimate.counters import CollectiveLog  # noqa: E402


def worker(crops: list[int], rows: int, out: str) -> None:
    from protein.model import FoldingModel
    from recipes.fold_tiny import FoldTinyConfig
    from trainers.parallel.mesh import setup_distributed
    from trainers.memory.saved_activations import SavedActivations
    from trainers.parallel.tensor import PartialGradients, apply_tensor_parallel
    from trainers.memory.tensor_peak import TensorPeak
    from zoo.plan import model_plan

    world = int(os.environ.get("WORLD_SIZE", "1"))
    env = setup_distributed(world)
    torch.manual_seed(0)
    model = FoldingModel(FoldTinyConfig().model).train()
    partial = PartialGradients([], None)
    if world > 1:
        partial = apply_tensor_parallel(model, model_plan(model), env.mesh["tp"], sequence_parallel=False)
    saved = SavedActivations(exclude=list(model.parameters()))

    def enter(*_) -> None:
        saved.__enter__()

    def leave(*_) -> None:
        saved.__exit__(None, None, None)

    model.evoformer.register_forward_pre_hook(enter)
    model.evoformer.register_forward_hook(leave)
    rows_out = []
    for crop in crops:
        batch = inputs(crop, rows, torch.device("cpu"))
        saved._storages.clear()
        with TensorPeak() as peak, CollectiveLog() as traffic:
            model(**batch, recycles=0)["loss"].backward()
            partial.sum()
        model.zero_grad(set_to_none=True)
        rows_out.append({"ranks": world, "crop": crop, "rows": rows, "evoformer_saved": saved.bytes,
                         "step_peak": peak.peak, "traffic": traffic.bytes})
    finish_worker(out, rows_out)


def table(rows: list[dict]) -> str:
    mib = 2**20
    lines = ["| crop | ranks | Evoformer saved | x one process | step peak | x one process | all-gather | all-to-all "
             "| all-reduce |", "|---|---|---|---|---|---|---|---|---|"]
    for crop in sorted({r["crop"] for r in rows}):
        one = next((r for r in rows if r["crop"] == crop and r["ranks"] == 1), None)  # absent without --ranks 1
        for r in sorted((r for r in rows if r["crop"] == crop), key=lambda r: r["ranks"]):
            cells = [f"{r['traffic'].get(kind, 0) / mib:.2f}" for kind in ("all_gather", "all_to_all", "all_reduce")]
            lines.append(f"| {crop} | {r['ranks']} | {r['evoformer_saved'] / mib:.2f} | "
                         f"{r['evoformer_saved'] / one['evoformer_saved'] if one else float('nan'):.3f} | "
                         f"{r['step_peak'] / mib:.2f} | "
                         f"{r['step_peak'] / one['step_peak'] if one else float('nan'):.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--crops", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--out", default="benchmarks/results/axial_parallel.jsonl")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.crops, args.rows, args.out)
        return
    started = time.time()
    rows = launch_ranks(__file__, args.ranks, args.out, ["--rows", str(args.rows), "--crops", *map(str, args.crops)],
                        {"MEMZOO_DEVICE": "cpu"})
    print(f"device: CPU ({os.cpu_count()} cores), gloo; torch {torch.__version__}; {time.time() - started:.0f} s\n")
    print(table(rows))


if __name__ == "__main__":
    main()
