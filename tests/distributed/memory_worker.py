"""Measured training-step memory, run by the estimator's tests under torchrun.

    memory_worker.py OUT CASE ...   CASE = model/zero/recompute[/schedule] (model: a
                                    `pipeline_worker.MODELS` key; a schedule pipelines the model
                                    over every rank, its blocks shared evenly): 2 steps of 4 x
                                    WORLD_SIZE examples in micro batches of 2 (2 per rank, or all
                                    through the pipeline), each two copies of the model's first
                                    example (what the estimate is given); every rank's memory
                                    report (of the second step) per case, to OUT

`estimate_case` is the estimator's side of a case, run by the test in processes of its own (no ranks).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path[:0] = [str(Path(__file__).resolve().parent)]

from pipeline_worker import MODELS, config  # noqa: E402
from trainers import MemoryEstimate, Strategy, TrainConfig, Trainer  # noqa: E402
from trainers.parallel.mesh import exit_process, shutdown_distributed  # noqa: E402
from trainers.estimate.trace import layout_job, trace_jobs  # noqa: E402
from zoo.plan import model_plan  # noqa: E402


def case_strategy(case: str, world_size: int = 2) -> tuple[str, Strategy]:
    """"model/zero/recompute[/schedule or epE]" -> (model, Strategy): pipelined over the ranks under
    the schedule, or the experts shared out over E ranks."""
    model, zero, recompute, *schedule = case.split("/")
    if not schedule:
        return model, Strategy(zero=int(zero), recompute=recompute)
    if schedule[0].startswith("ep"):
        return model, Strategy(zero=int(zero), recompute=recompute, ep=int(schedule[0][2:]))
    built = MODELS[model][0]()
    blocks = len(model_plan(built).block_names(built))
    split = tuple(blocks // world_size + (i < blocks % world_size) for i in range(world_size))
    return model, Strategy(zero=int(zero), recompute=recompute, pp=world_size, pp_schedule=schedule[0], pp_split=split)


def case_inputs(case: str) -> tuple[torch.nn.Module, dict, Strategy, TrainConfig]:
    """What the estimator is given for a CASE: the model, the batch `measure` trains on, the
    strategy and the step's batch sizes (on 2 ranks)."""
    name, strategy = case_strategy(case)
    build, examples, collate = MODELS[name]
    first = examples(1)[0]
    return build(), collate([first, first]), strategy, config(global_batch_size=8, max_steps=2)


def estimate_case(case: str) -> MemoryEstimate:
    """The estimate of a CASE on 2 ranks traced in this process (`estimate_memory` would start a
    fresh one): call it from a process without a process group."""
    model, batch, strategy, step = case_inputs(case)
    return trace_jobs(model, batch, [layout_job(strategy, 2, step, 2)])[0]


def measure(out: str, *cases: str) -> None:
    reports = {}
    for case in cases:
        world_size = int(os.environ["WORLD_SIZE"])
        name, strategy = case_strategy(case, world_size)
        build, examples, collate = MODELS[name]
        trainer = Trainer(build(), config(global_batch_size=4 * world_size, max_steps=2, measure_memory=True), strategy)
        trainer.fit([examples(1)[0]] * 16, collate_fn=collate)
        reports[case] = trainer.memory_report()
    if dist.get_rank() == 0:
        torch.save(reports, out)


if __name__ == "__main__":
    measure(*sys.argv[1:])
    shutdown_distributed()
    exit_process(0)
