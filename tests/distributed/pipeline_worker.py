"""Pipeline-parallel scenarios, run by the tests under torchrun; each writes its results (full
tensors gathered on rank 0) to a file the test compares.

    pipeline_worker.py parity OUT RUN ...   RUN = model/schedule/pp/stages_per_rank/zero: train 3 steps
                                            (dp = world / pp); losses, gradient norms, eval loss, params
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path[:0] = [str(Path(__file__).resolve().parents[2])]
sys.path += [str(Path(__file__).resolve().parents[1])]

from helpers import lm_examples, tiny_gpt  # noqa: E402
from trainers import Strategy, TrainConfig, Trainer  # noqa: E402
from trainers.distributed import exit_process, shutdown_distributed  # noqa: E402
from worker import FeedForwardLM  # noqa: E402

MODELS = {
    "gpt": lambda: tiny_gpt(n_layer=4),
    "custom": lambda: FeedForwardLM(layers=4),
}
"""Models with four blocks (pp=2 x 2 stages per rank at most); GPT without biases (a key bias's
gradient is zero up to rounding, which AdamW amplifies)."""


def config(**overrides) -> TrainConfig:
    """SGD-like conditions for parity: AdamW at lr 1e-3 does not amplify summation-order noise."""
    base = dict(global_batch_size=8, micro_batch_size=2, max_steps=3, lr=1e-3, warmup_steps=1, log_every=1,
                progress=False, output_dir="/tmp/memzoo-test-runs", grad_clip=0.5, eval_batches=2)
    return TrainConfig(**{**base, **overrides})


def parity(out: str, *runs: str) -> None:
    results = {}
    data, held_out = lm_examples(64), lm_examples(8, seed=5)
    for run in runs:
        model, schedule, pp, stages_per_rank, zero = run.split("/")
        strategy = Strategy(pp=int(pp), pp_schedule=schedule, stages_per_rank=int(stages_per_rank), zero=int(zero))
        example = {key: torch.stack([e[key] for e in data[:2]]) for key in data[0]}
        trainer = Trainer(MODELS[model](), config(), strategy, example_batch=example)
        history = trainer.fit(data, held_out)
        results[run] = {"params": trainer.full_state_dict(), "losses": [r["loss"] for r in history],
                        "grad_norms": [r["grad_norm"] for r in history], "eval_loss": history[-1]["eval_loss"]}
    if dist.get_rank() == 0:
        torch.save(results, out)


if __name__ == "__main__":
    command, *arguments = sys.argv[1:]
    {"parity": parity}[command](*arguments)
    shutdown_distributed()
    exit_process(0)
