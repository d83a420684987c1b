"""Training-step speed of the zoo's models against Hugging Face transformers, eager and compiled:
step time, tokens a second, model-FLOPs utilisation and activation memory, side by side in one
process.

    python benchmarks/speed.py [--device cpu|cuda] [--dtype float32|bfloat16] [--steps 5]
                               [--models gpt2-small,gpt2-medium,bert-base,vit-base] [--batch N]
                               [--compile blocks|model]

For each model four implementations train on the same inputs: "hf" (transformers, SDPA
attention), "hf-compiled" (the whole HF model under `torch.compile`), "ours" (the zoo's model
holding HF's weights) and "ours-compiled" (`Strategy(compile=--compile)`: each block compiled, the
default, or the whole model as HF's is).
The compiled twin shares its eager model's parameters, so one process holds two copies of the
weights, not four. A step is forward, loss, backward and a fused AdamW step (`fused=True`: the
optimizer both trainers take, memzoo's and transformers' `adamw_torch_fused`) at learning rate 0 (all its
work, the weights unchanged: every implementation's loss is on the same weights; the models keep
HF's default dropout of 0.1, so the losses differ by their masks, ours and ours compiled drawing
the same ones given the same generator state). After one warm-up step per
implementation (which compiles; its time is reported) the implementations run `--steps` steps in
turns, one step each, the order rotating, and each reports its median: this machine's speed
drifts, and the turns spread the drift over all four. A speed ratio is the median over the turns
of the two implementations' step times in the same turn (a drift slower than a turn cancels in
it), with the middle half of those ratios (25th to 75th percentile) beside it.

Tokens are the model's positions a step (GPT: batch x sequence; BERT: batch x sequence; ViT:
batch x patches + class token). FLOPs are counted once per family on an eager step
(`trainers.estimate.counters.WorkCount`: matrix multiplies and attention, forward and backward) and
stand for its compiled twin; MFU is FLOPs / step time / the device's peak
(`trainers.loop.throughput.device_peak`: a named GPU's datasheet figure, else measured here).
Memory: the bytes autograd saves for backward in one forward (storages counted once, parameters
excluded), and on a GPU `torch.cuda.max_memory_allocated` above the memory in use before the step.

Shapes follow the issue's: GPT-2 small and the 350M GPT-2 medium at 1024 tokens, BERT-base at 512,
ViT-B/16 at 224x224; `--batch` sets every model's batch (default 8 on a GPU, 1 on a CPU). The 350M
GPT-2 medium's four implementations (two copies of the weights, gradients and AdamW's state, the
compiled graphs) outgrow a 24 GiB machine: on such a CPU leave it out of `--models`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from hf_models import VIT_CONFIGS, build  # noqa: E402
from trainers import Strategy  # noqa: E402
from trainers.speed.compile import apply_compile  # noqa: E402
from trainers.estimate.counters import WorkCount  # noqa: E402
from trainers.loop.throughput import device_peak  # noqa: E402
from trainers.memory.saved_activations import SavedActivations  # noqa: E402
from zoo.plan import model_plan  # noqa: E402

warnings.filterwarnings("ignore")

SEQUENCE = {"gpt2-small": 1024, "gpt2-medium": 1024, "bert-base": 512, "vit-base": 197}
"""Positions a step per example (ViT-B/16 at 224: 196 patches and the class token)."""
IMPLEMENTATIONS = ("hf", "hf-compiled", "ours", "ours-compiled")


def batch(model_name: str, size: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Inputs of one step in Hugging Face's keys (GPT: input_ids with one more token for the shift)."""
    generator = torch.Generator().manual_seed(1)
    if model_name in VIT_CONFIGS:
        labels = torch.randint(0, VIT_CONFIGS[model_name]["num_labels"], (size,), generator=generator)
        return {"pixel_values": torch.randn(size, 3, 224, 224, generator=generator).to(device), "labels": labels.to(device)}
    length = SEQUENCE[model_name]
    if model_name.startswith("gpt2"):
        ids = torch.randint(0, 50257, (size, length), generator=generator)
        return {"input_ids": ids.to(device), "labels": ids.to(device)}
    ids = torch.randint(1000, 30522, (size, length), generator=generator)
    labels = torch.where(torch.rand(size, length, generator=generator) < 0.15, ids, -100)
    return {"input_ids": ids.to(device), "labels": labels.to(device)}


def loss_of(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    if "pixel_values" in inputs:
        inputs = dict(inputs, pixel_values=inputs["pixel_values"].to(next(model.parameters()).dtype))
    output = model(**inputs)
    return output["loss"]


def twin(model: nn.Module, implementation: str, compile_mode: str) -> nn.Module:
    """The compiled twin of `model`, sharing its parameters: HF's whole model compiled, ours as
    `Strategy(compile=compile_mode)` compiles it."""
    if implementation == "hf-compiled":
        return torch.compile(model)
    copy = build_like(model)
    apply_compile(copy, Strategy(compile=compile_mode), model_plan(copy).block_names(copy))
    return copy


def build_like(model: nn.Module) -> nn.Module:
    """A second module tree over the same parameter and buffer objects as `model`."""
    import copy

    memo = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return copy.deepcopy(model, memo)


class Variant:
    """One implementation's model, optimizer and measurements."""

    def __init__(self, name: str, model: nn.Module, optimizer: torch.optim.Optimizer, inputs: dict, device) -> None:
        self.name, self.model, self.optimizer, self.inputs, self.device = name, model, optimizer, inputs, device
        self.times: list[float] = []
        self.peak_above = 0

    def step(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        started = time.perf_counter()
        loss = loss_of(self.model, self.inputs)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak_above = max(self.peak_above, torch.cuda.max_memory_allocated() - base)
        self.loss = loss.item()
        return time.perf_counter() - started


def flops_of(variant: Variant) -> float:
    with WorkCount() as counter:
        loss_of(variant.model, variant.inputs).backward()
    variant.optimizer.zero_grad(set_to_none=True)
    return float(counter.work.flops)


def saved_mib(variant: Variant) -> float:
    with SavedActivations(exclude=variant.model.parameters()) as saved:
        loss = loss_of(variant.model, variant.inputs)
    del loss
    return saved.bytes / 2**20


def measure(model_name: str, size: int, steps: int, device: torch.device, dtype: torch.dtype,
            compile_mode: str = "blocks") -> list[dict]:
    inputs = batch(model_name, size, device)
    variants = []
    for family in ("hf", "ours"):
        model = build(model_name, family).to(device=device, dtype=dtype).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.0, fused=True)  # full work, weights kept: losses comparable
        eager = Variant(family, model, optimizer, inputs, device)
        variants += [eager, Variant(f"{family}-compiled", twin(model, f"{family}-compiled", compile_mode), optimizer, inputs, device)]
    flops = {v.name: flops_of(v) for v in variants if not v.name.endswith("compiled")}
    warm = {v.name: v.step() for v in variants}
    for turn in range(steps):
        for variant in variants[turn % 4:] + variants[: turn % 4]:
            variant.times.append(variant.step())
    peak = device_peak(device, dtype)
    rows = []
    for variant in variants:
        step = statistics.median(variant.times)
        work = flops[variant.name.removesuffix("-compiled")]
        rows.append({"impl": variant.name, "step_s": step, "first_step_s": warm[variant.name],
                     "tokens_per_s": size * SEQUENCE[model_name] / step, "mfu": work / step / peak.flops,
                     "saved_mib": saved_mib(variant), "peak_above_mib": variant.peak_above / 2**20,
                     "loss": variant.loss, "peak_source": peak.source, "times": variant.times})
    return rows


def speed_ratio(ours: list[float], theirs: list[float]) -> tuple[float, float, float]:
    """(median, 25th and 75th percentiles) over the turns of theirs / ours, the step times of one
    turn paired (> 1: ours is faster)."""
    ratios = [t / o for o, t in zip(ours, theirs, strict=True)]
    low, _, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
    return statistics.median(ratios), low, high


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--models", default="gpt2-small,gpt2-medium,bert-base,vit-base")
    parser.add_argument("--compile", default="blocks", choices=["blocks", "model"],
                        help="how ours-compiled is compiled (Strategy.compile)")
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    size = args.batch or (8 if device.type == "cuda" else 1)
    name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"device: {name}; dtype {args.dtype}; batch {size}; {args.steps} steps in turns; ours compiled: "
          f"{args.compile}; torch {torch.__version__}\n")
    print("| model | impl | step s (median) | first step s | tokens/s | MFU | saved MiB | peak above states MiB | "
          "loss |\n|---|---|---|---|---|---|---|---|---|")
    for model_name in args.models.split(","):
        rows = measure(model_name, size, args.steps, device, dtype, args.compile)
        for row in rows:
            peak = f"{row['peak_above_mib']:.0f}" if device.type == "cuda" else "-"
            print(f"| {model_name} | {row['impl']} | {row['step_s']:.3f} | {row['first_step_s']:.1f} | "
                  f"{row['tokens_per_s']:.0f} | {100 * row['mfu']:.1f}% | {row['saved_mib']:.0f} | {peak} | "
                  f"{row['loss']:.4f} |")
        by = {row["impl"]: row for row in rows}
        for ours, theirs in (("ours", "hf"), ("ours-compiled", "hf-compiled"), ("ours-compiled", "hf")):
            median, low, high = speed_ratio(by[ours]["times"], by[theirs]["times"])
            print(f"| {model_name} | {ours} / {theirs} | speed {median:.2f}x (middle half {low:.2f}-{high:.2f}) | | | | "
                  f"{by[ours]['saved_mib'] / by[theirs]['saved_mib']:.2f}x | | |")
        print(f"(MFU peak: {rows[0]['peak_source']})", file=sys.stderr)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
