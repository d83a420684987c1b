"""Peak memory and time of a folding-model training step against crop length, for the plain model
and with the memory techniques added one by one; and the longest crop each fits in the memory
the plain model needs at --budget-crop.

    python benchmarks/fold_memory.py [--device cpu|cuda] [--crops 32 64 128] [--budget-crop 64]
                                     [--chunk-budget-mib 4] [--max-crop 1024]

Settings: "plain" (fp32), "recompute" (each Evoformer block recomputed in backward, applied by
trainers.memory.recompute.apply_recompute from the model's plan), "recompute+chunk" (the Evoformer's
chunked modules held to --chunk-budget-mib per chunk), "recompute+chunk+bf16" (bf16 autocast with
the fp32 islands of protein.precision). The model is fold_tiny's (4 blocks, widths 32/32), one
crop per step, 8 MSA rows, no recycling; the step is forward + losses + backward. Peak = tensor
bytes created by the step alive at once (`TensorPeak` on CPU, `torch.cuda.max_memory_allocated`
on CUDA), parameters excluded, gradients included.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from measure import timed_peak
from protein.features import msa_features
from protein.model import FoldingModel
from recipes.fold_tiny import FoldTinyConfig
from trainers.memory.recompute import RecomputePolicy, apply_recompute, uniform_keep

SETTINGS = ("plain", "recompute", "recompute+chunk", "recompute+chunk+bf16")


def inputs(length: int, rows: int, device: torch.device) -> dict[str, torch.Tensor]:
    """A random sequence with a random profile and a random-walk backbone (values do not change memory)."""
    g = torch.Generator().manual_seed(0)
    residues = torch.randint(0, 20, (length,), generator=g)
    msa, msa_mask = msa_features(residues, torch.rand(length, 20, generator=g).softmax(-1), rows, g)
    steps = torch.randn(length * 5, 3, generator=g)
    coordinates = (1.5 * steps / steps.norm(dim=-1, keepdim=True)).cumsum(0).view(length, 5, 3)
    batch = {"input_ids": residues, "attention_mask": torch.ones(length), "position_ids": torch.arange(length),
             "msa_features": msa, "msa_mask": msa_mask, "coordinates": coordinates,
             "atom_mask": torch.ones(length, 5, dtype=torch.bool)}
    return {k: v[None].to(device) for k, v in batch.items()}


def build(setting: str, chunk_budget: int, device: torch.device) -> FoldingModel:
    config = FoldTinyConfig().model
    if "chunk" in setting:
        config = dataclasses.replace(config, memory_budget=chunk_budget)
    torch.manual_seed(0)
    model = FoldingModel(config).to(device).train()
    if "recompute" in setting:
        apply_recompute(model, RecomputePolicy(uniform_keep(model.parallel_plan().block_names(model), "blocks")))
    return model


def step(model: FoldingModel, batch: dict[str, torch.Tensor], bf16: bool) -> float:
    for parameter in model.parameters():
        parameter.grad = None
    with torch.autocast(batch["input_ids"].device.type, dtype=torch.bfloat16, enabled=bf16):
        loss = model(**batch, recycles=0)["loss"]
    loss.backward()
    return loss.item()


def measure(setting: str, length: int, chunk_budget: int, device: torch.device, timed: bool = True
            ) -> tuple[float | None, int]:
    """(seconds, peak bytes) of one training step (after a warm-up step at a small crop). The time
    is of a second, untracked step (None unless `timed`): on CPU, TensorPeak's per-op bookkeeping
    would weigh on the many small ops of small chunks."""
    model, bf16 = build(setting, chunk_budget, device), setting.endswith("bf16")
    step(model, inputs(16, 8, device), bf16)
    batch = inputs(length, 8, device)
    _, _, peak = timed_peak(lambda: step(model, batch, bf16), device)
    if not timed:
        return None, peak
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    synchronize()
    started = time.perf_counter()
    step(model, batch, bf16)
    synchronize()
    return time.perf_counter() - started, peak


def longest_crop(setting: str, budget: int, chunk_budget: int, device: torch.device, start: int, most: int) -> int:
    """The longest crop (a multiple of 8, at most `most`) whose step peak stays within `budget`
    bytes: doubling from `start`, then bisecting."""
    low, high = start, start
    while high <= most and measure(setting, high, chunk_budget, device, timed=False)[1] <= budget:
        low, high = high, high * 2
    high = min(high, most + 8)
    while high - low > 8:
        middle = (low + high) // 2 // 8 * 8
        low, high = (middle, high) if measure(setting, middle, chunk_budget, device, timed=False)[1] <= budget else (low, middle)
    return low


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--crops", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--budget-crop", type=int, default=64)
    parser.add_argument("--chunk-budget-mib", type=float, default=4.0)
    parser.add_argument("--max-crop", type=int, default=1024)
    args = parser.parse_args()
    device, chunk_budget = torch.device(args.device), int(args.chunk_budget_mib * 2**20)
    print(f"device {device}; step = forward + losses + backward, one crop, 8 MSA rows, no recycling\n")
    print("| setting | " + " | ".join(f"crop {n}: peak MiB / s" for n in args.crops) + " |")
    print("|---|" + "---|" * len(args.crops))
    for setting in SETTINGS:
        cells = [measure(setting, n, chunk_budget, device) for n in args.crops]
        print(f"| {setting} | " + " | ".join(f"{peak / 2**20:.0f} / {seconds:.2f}" for seconds, peak in cells) + " |")
    budget = measure("plain", args.budget_crop, chunk_budget, device, timed=False)[1]
    print(f"\nlongest crop within the plain model's peak at crop {args.budget_crop} ({budget / 2**20:.0f} MiB):\n")
    print("| setting | longest crop | vs plain |\n|---|---|---|")
    plain = None
    for setting in SETTINGS:
        crop = longest_crop(setting, budget, chunk_budget, device, args.budget_crop, args.max_crop)
        plain = plain or crop
        print(f"| {setting} | {crop} | {crop / plain:.1f}x |")


if __name__ == "__main__":
    main()
