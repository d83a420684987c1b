"""A memory budget planned without an example batch: the zoo's GPT on Shakespeare characters
(width 32, 32 x 128 characters a step, dropout 0) trained 2 steps unconstrained, then 2 steps under
a quarter of that run's measured peak, the trainer planning at `fit` for the training set's largest
micro batch (and lowering the micro batch where no layout holds it). The cases of
`tests/trainers/test_memory_budget.py`.

    PYTHONPATH=.:tests python benchmarks/budget_from_training_set.py BLOCKS [ROWS]

Prints the unconstrained peak, the budget, the measured peaks under it, the plan, the micro batch
and each step's relative loss difference.
"""

from __future__ import annotations

import argparse
import logging
import tempfile

import torch

from helpers import shakespeare_gpt
from trainers import Strategy, TrainConfig, Trainer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("blocks", type=int)
    parser.add_argument("rows", type=int, nargs="?", default=32)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    build, data, _, rows = shakespeare_gpt(n_layer=args.blocks, rows=args.rows, dropout=0.0)
    folder = tempfile.mkdtemp()

    def train(budget):
        config = TrainConfig(global_batch_size=rows, micro_batch_size=rows, max_steps=2, lr=1e-3, warmup_steps=1,
                             log_every=1, progress=False, output_dir=f"{folder}/run-{budget}")
        torch.manual_seed(0)
        trainer = Trainer(build(), config, Strategy(memory_budget=budget))
        return trainer, trainer.fit(data)

    free, free_history = train(None)
    peak = free.memory_report()[0]["peak"]
    held, history = train(peak // 4)
    mib = 2**20
    measured = ", ".join(f"{record['measured_peak_bytes'] / mib:.2f}" for record in history)
    print(f"{args.blocks} blocks: unconstrained peak {peak / mib:.2f} MiB, budget {peak / 4 / mib:.2f} MiB, measured "
          f"{measured} MiB; {held.budget.plan.describe()}; "
          f"micro batch {held.config.micro_batch_size}; relative loss differences "
          f"{[abs(a['loss'] - b['loss']) / b['loss'] for a, b in zip(history, free_history)]}")


if __name__ == "__main__":
    main()
