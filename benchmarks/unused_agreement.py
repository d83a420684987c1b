"""What the ranks' agreement on the units a training forward runs costs (`trainers.parallel.unused`:
one small all-reduce before each block and at the forward's end, zero terms on the graph): GPT under
ZeRO-3 on 2 gloo ranks, step time with the agreement and without it, in turns.

    python benchmarks/unused_agreement.py [--layers 8] [--width 256] [--steps 6] [--turns 3]

Prints the median step time of each variant and their ratio. "without" replaces
`EveryParameterTakesPart` by nothing for that Trainer (the layout a model whose data never choose its
parameters would need); each turn builds a fresh Trainer of each variant, times `fit` over `--steps`
steps after one untimed step, and the order of the two alternates from turn to turn.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the root first: tests/ mirrors its package names


def step_seconds(agreement: bool, args: argparse.Namespace, folder: str) -> float:
    import trainers.parallelize as parallelize
    from helpers import lm_examples, tiny_gpt
    from trainers import Strategy, TrainConfig, Trainer

    original = parallelize.EveryParameterTakesPart
    if not agreement:
        parallelize.EveryParameterTakesPart = lambda *unused: None
    try:
        model = tiny_gpt(n_layer=args.layers, n_embd=args.width, n_head=4, block_size=128, vocab_size=4096)
        config = TrainConfig(global_batch_size=8, micro_batch_size=2, max_steps=1, lr=1e-3, progress=False,
                             measure_memory=False, log_every=1000, output_dir=folder)
        trainer = Trainer(model, config, Strategy(zero=3))
    finally:
        parallelize.EveryParameterTakesPart = original
    data = lm_examples(8 * (args.steps + 1), length=128, vocab=4096)
    trainer.fit(data)  # the first step: FSDP2's lazy initialisation
    trainer.config.max_steps = args.steps + 1
    started = time.perf_counter()
    trainer.fit(data)
    return (time.perf_counter() - started) / args.steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    if "WORLD_SIZE" not in os.environ:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        sys.exit(subprocess.call([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                                  __file__, *sys.argv[1:]], env=env))
    import tempfile

    import torch.distributed as dist

    times: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as folder:
        for turn in range(args.turns):
            for agreement in ((True, False) if turn % 2 == 0 else (False, True)):
                times[agreement].append(step_seconds(agreement, args, f"{folder}/{turn}-{agreement}"))
    if dist.get_rank() == 0:
        with_, without = statistics.median(times[True]), statistics.median(times[False])
        print(f"GPT {args.layers} x {args.width}, ZeRO-3 on 2 gloo ranks, 4 micro batches of 2 x 128 a step: "
              f"{with_:.3f} s a step with the agreement, {without:.3f} s without ({with_ / without:.3f}x); "
              f"turns: {[round(t, 3) for t in times[True]]} / {[round(t, 3) for t in times[False]]}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
