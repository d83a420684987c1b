"""Measured training-step memory, run by the estimator's tests under torchrun.

    memory_worker.py OUT CASE ...   CASE = model/zero/recompute (a `pipeline_worker.MODELS` key):
                                    2 steps of 2 micro batches per rank, each micro batch two copies
                                    of the model's first example (what the estimate is given); every
                                    rank's memory report (of the second step) per case, to OUT
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path[:0] = [str(Path(__file__).resolve().parent)]

from pipeline_worker import MODELS, config  # noqa: E402
from trainers import Strategy, Trainer  # noqa: E402
from trainers.distributed import exit_process, shutdown_distributed  # noqa: E402


def case_strategy(case: str) -> tuple[str, Strategy]:
    """"model/zero/recompute" -> (model, Strategy)."""
    model, zero, recompute = case.split("/")
    return model, Strategy(zero=int(zero), recompute=recompute)


def measure(out: str, *cases: str) -> None:
    reports = {}
    for case in cases:
        name, strategy = case_strategy(case)
        build, examples, collate = MODELS[name]
        trainer = Trainer(build(), config(global_batch_size=4 * int(os.environ["WORLD_SIZE"]), max_steps=2), strategy)
        trainer.fit([examples(1)[0]] * 16, collate_fn=collate)
        reports[case] = trainer.memory_report()
    if dist.get_rank() == 0:
        torch.save(reports, out)


if __name__ == "__main__":
    measure(*sys.argv[1:])
    shutdown_distributed()
    exit_process(0)
