"""Collective traffic of one training step at each ZeRO stage, from the estimator's trace (no
process group needed): the tiny test GPT on 2 ranks, 4 micro batches of 2 examples a rank.

    PYTHONPATH=.:tests python benchmarks/zero_traffic.py

Prints, per stage, each collective's payload in units of the parameter bytes and its calls
(rank 0), and the estimated peak per rank.
"""

from __future__ import annotations

from helpers import lm_examples, tiny_gpt
from trainers import Strategy, TrainConfig
from trainers.estimate.trace import estimate_memory
from trainers.loop.data import first_micro_batch


def main() -> None:
    model = tiny_gpt()
    batch = first_micro_batch(lm_examples(8), 2)
    config = TrainConfig(global_batch_size=16, micro_batch_size=2, max_steps=1, progress=False)
    parameter_bytes = 4 * sum(p.numel() for p in model.parameters())
    print(f"{sum(p.numel() for p in model.parameters()):,} parameters in {len(list(model.parameters()))} tensors")
    print("| ZeRO | collective: payload / parameter bytes (calls) | estimated peak MiB |\n|---|---|---|")
    for zero in range(4):
        estimate = estimate_memory(model, batch, Strategy(zero=zero), 2, config)
        kinds: dict[str, list[int]] = {}
        for (kind, _), (nbytes, calls) in estimate.traffic[0].items():
            totals = kinds.setdefault(kind, [0, 0])
            totals[0] += nbytes
            totals[1] += calls
        cells = ", ".join(f"{kind} {nbytes / parameter_bytes:.1f} ({calls})" for kind, (nbytes, calls) in sorted(kinds.items()))
        print(f"| {zero} | {cells} | {max(estimate.rank_peaks(device_only=False)) / 2**20:.2f} |")


if __name__ == "__main__":
    main()
