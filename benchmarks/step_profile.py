"""Where two implementations' training steps spend their time, operator by operator: HF's and the
zoo's model of one family (`speed.py`'s models, inputs and fused AdamW), eager or compiled, profiled
one step at a time in alternation (this machine's speed drifts; alternation spreads the drift over both).

    python benchmarks/step_profile.py [--model vit-base] [--compiled] [--compile blocks|model]
                                      [--steps 6] [--rows 30]

Prints each operator's self CPU time a step (milliseconds, mean over --steps profiled steps) and
calls a step for both, the operators taking the most time on either side first, and each side's total.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path[:0] = [str(Path(__file__).resolve().parent)]

from speed import batch, build, loss_of, twin  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit-base")
    parser.add_argument("--compiled", action="store_true", help="profile the compiled twins (HF's whole model)")
    parser.add_argument("--compile", default="blocks", choices=["blocks", "model"], help="how ours is compiled")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rows", type=int, default=30)
    args = parser.parse_args()
    inputs = batch(args.model, 1, torch.device("cpu"))
    steps = {}
    for family in ("hf", "ours"):
        model = build(args.model, family).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.0, fused=True)
        stepped = twin(model, f"{family}-compiled", args.compile) if args.compiled else model

        def step(stepped=stepped, optimizer=optimizer) -> None:
            loss_of(stepped, inputs).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        steps[family] = step
        for _ in range(3):  # warm-up (and compilation)
            step()
    time_ms = {family: collections.Counter() for family in steps}
    calls = {family: collections.Counter() for family in steps}
    for turn in range(args.steps):
        for family in (("hf", "ours") if turn % 2 == 0 else ("ours", "hf")):
            with profile(activities=[ProfilerActivity.CPU]) as profiled:
                steps[family]()
            for event in profiled.key_averages():
                time_ms[family][event.key] += event.self_cpu_time_total / 1000 / args.steps
                calls[family][event.key] += event.count / args.steps
    keys = sorted(set(time_ms["hf"]) | set(time_ms["ours"]), key=lambda k: -max(time_ms["hf"][k], time_ms["ours"][k]))
    print(f"{args.model}, {'compiled (ours: ' + args.compile + ')' if args.compiled else 'eager'}, "
          f"{torch.get_num_threads()} threads; self CPU ms a step (calls)\n")
    print("| operator | hf | ours |\n|---|---|---|")
    for key in keys[: args.rows]:
        print(f"| {key[:80]} | {time_ms['hf'][key]:.1f} ({calls['hf'][key]:.0f}) | "
              f"{time_ms['ours'][key]:.1f} ({calls['ours'][key]:.0f}) |")
    print(f"| total | {sum(time_ms['hf'].values()):.1f} | {sum(time_ms['ours'].values()):.1f} |")


if __name__ == "__main__":
    main()
