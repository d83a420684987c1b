"""Training under a hard memory budget: each model trained unconstrained, then with
`Strategy(memory_budget=)` set to a fraction of the unconstrained run's measured peak (on a GPU:
the cuBLAS workspaces, a fixed 65 MiB on the H200 that no plan can shrink, plus that fraction of
the peak above them).

    python benchmarks/memory_budget.py [--families gpt conformer fold] [--fraction 0.25] [--steps 6]
                                       [--size small|large] [--out FILE.jsonl]

Each run is a real `Trainer.fit` on one process: GPT on Shakespeare characters, the Conformer
transducer with the sample-wise RNN-T loss on the 10 recordings of Debian's pocketsphinx-testdata,
the folding model on real PDB chains. The peak is the trainer's own measurement (the tracker's
live tensor bytes; `torch.cuda.max_memory_allocated` on a GPU) of every step it measured; the
budget run measures its steps until two stayed within the budget. Printed: both peaks, the
budget, the plan and the candidates traced for it (with their estimated peaks), the largest
relative loss difference over the steps and the mean step time after the first two (which the
budget run measures with its tracker).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from trainers import Strategy, TrainConfig, Trainer
from trainers.loop.data import first_micro_batch
from trainers.memory.measure import cuda_workspace_bytes
from zoo.nn import chunk_memory

FAMILIES = ("gpt", "conformer", "fold")
SIZES = {"small": dict(layers=8, width=32), "large": dict(layers=16, width=64)}
"""Blocks (GPT: twice as many) and GPT width per size."""


def case(family: str, size: str):
    """(model builder, dataset, collate function or None) of `family` at `size`."""
    layers, width = SIZES[size]["layers"], SIZES[size]["width"]
    if family == "gpt":
        from nlp.data import TokenBlocks
        from nlp.gpt import GPT, GPTConfig
        from nlp.tokenizers import CharTokenizer
        from zoo.corpora import shakespeare_text

        text = shakespeare_text()[:100_000]
        tokenizer = CharTokenizer("".join(sorted(set(text))))
        data = TokenBlocks(torch.tensor(tokenizer.encode(text)), 128)
        config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=128, n_layer=2 * layers, n_head=4,
                           n_embd=width, dropout=0.1)
        return (lambda: GPT(config)), data, None, 32
    if family == "conformer":
        from asr.data import SpeechExamples, collate_speech, recorded_speech
        from asr.model import Transducer, TransducerConfig
        from asr.text import TranscriptTokenizer

        tokenizer = TranscriptTokenizer("char")
        data = list(SpeechExamples(recorded_speech(), tokenizer))  # all 10 in every step: the same shapes
        config = TransducerConfig.sized("tiny", vocab_size=tokenizer.vocab_size, encoder_layers=layers + 4,
                                        encoder_width=96, decoder_dim=96, joiner_dim=96, loss="samplewise",
                                        spec_augment=None)
        return (lambda: Transducer(config)), data, collate_speech, len(data)
    if family == "fold":
        from protein.data import CropConfig, FoldingExamples, collate_folding, load_chains
        from protein.evoformer import EvoformerConfig
        from protein.model import FoldConfig, FoldingModel

        chains = [chain for chain in load_chains("train") if len(chain.sequence) >= 64][:8]
        data = FoldingExamples(chains, CropConfig(crop_size=64, msa_rows=8, withhold_profile=0.0))
        config = FoldConfig(evoformer=EvoformerConfig(blocks=layers), max_recycles=0)
        return (lambda: FoldingModel(config)), data, collate_folding, 1
    raise ValueError(f"family must be one of {FAMILIES}; got {family!r}")


def train(family: str, size: str, budget: int | None, steps: int, output_dir: str) -> dict:
    """One run: its per-step losses, the largest measured peak, the plan and the time."""
    build, data, collate, rows = case(family, size)
    config = TrainConfig(global_batch_size=rows, micro_batch_size=rows, max_steps=steps, lr=1e-3, warmup_steps=1,
                         log_every=1, progress=False, output_dir=output_dir)
    torch.manual_seed(0)
    started = time.perf_counter()
    trainer = Trainer(build(), config, Strategy(memory_budget=budget),
                      example_batch=first_micro_batch(data, rows, collate))
    planned = time.perf_counter() - started
    history = trainer.fit(data, collate_fn=collate)
    chunk_memory.set_chunk_bytes(None)  # the next run starts from the default chunks
    peaks = [r["measured_peak_bytes"] for r in history if "measured_peak_bytes" in r]
    report = trainer.memory_report()[0]
    peaks.append(report["cuda_max_allocated"] if report["cuda_max_allocated"] is not None else report["peak"])
    return {"losses": [r["loss"] for r in history], "peak": max(peaks),
            "plan": None if trainer.budget is None else trainer.budget.plan.describe(),
            "candidates": None if trainer.budget is None else trainer.budget.plan.tried,
            "plan_seconds": planned, "step_seconds": [r["step_seconds"] for r in history],
            "device": trainer.env.device}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--fraction", type=float, default=0.25,
                        help="budget over the unconstrained peak (on a GPU: over the peak above the workspaces)")
    parser.add_argument("--steps", type=int, default=6, help="at least 3: the steps after the first two are timed")
    parser.add_argument("--size", default="small", choices=sorted(SIZES))
    parser.add_argument("--out", help="also append each row to this JSON-lines file")
    args = parser.parse_args()
    rows = []
    for family in args.families:
        free = train(family, args.size, None, args.steps, f"/tmp/memzoo-budget-bench/{family}-free")
        workspaces = cuda_workspace_bytes(free["device"], torch.float32) if free["device"].type == "cuda" else 0
        budget = int(workspaces + (free["peak"] - workspaces) * args.fraction)
        held = train(family, args.size, budget, args.steps, f"/tmp/memzoo-budget-bench/{family}-budget")
        difference = max(abs(a - b) / abs(b) for a, b in zip(held["losses"], free["losses"]))
        rows.append({"family": family, "free_peak": free["peak"], "workspaces": workspaces, "budget": budget,
                     "budget_peak": held["peak"],
                     "loss_difference": difference, "plan": held["plan"], "candidates": held["candidates"],
                     "plan_seconds": held["plan_seconds"],
                     "free_step_seconds": statistics.mean(free["step_seconds"][2:]),
                     "budget_step_seconds": statistics.mean(held["step_seconds"][2:])})
        print(json.dumps(rows[-1]), flush=True)
        if args.out:
            with open(args.out, "a") as out:
                out.write(json.dumps(rows[-1]) + "\n")
    print("| model | unconstrained peak | budget | peak under budget | max loss difference | step s (free / budget) | plan |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['family']} | {row['free_peak'] / 2**20:.1f} MiB | {row['budget'] / 2**20:.1f} MiB | "
              f"{row['budget_peak'] / 2**20:.1f} MiB | {row['loss_difference']:.1e} | "
              f"{row['free_step_seconds']:.2f} / {row['budget_step_seconds']:.2f} | {row['plan']} |")


if __name__ == "__main__":
    main()
