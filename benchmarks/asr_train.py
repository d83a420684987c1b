"""Peak memory and time of a transducer training step with the full, pruned, sample-wise and
sample-wise + pruned losses at equal batch, and the largest batch each fits in a memory budget.

    python benchmarks/asr_train.py [--device cpu|cuda] [--batch 16] [--frames 400] [--symbols 40]
                                   [--vocab 500] [--budget-mib 1024] [--size tiny]

The step is forward + loss + backward of `asr.model.Transducer` in train mode (no optimizer) on
log-mel-shaped inputs of `frames` frames (4x subsampled by the encoder) and `symbols` labels per
utterance; peak = the tensor bytes created by the step alive at once (`TensorPeak` on CPU,
`torch.cuda.max_memory_allocated` on CUDA), parameters excluded, gradients included. Time is the
median of --repeats steps after one warm-up. The largest batch is found by doubling, then
bisecting, up to --max-batch.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from asr.model import LOSS_KINDS, Transducer, TransducerConfig
from measure import timed_peak


def batch(size: int, frames: int, symbols: int, vocab: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Random features and labels; lengths from 75% to 100% of the padded sizes."""
    g = torch.Generator().manual_seed(0)
    features = torch.randn(size, frames, 80, generator=g)
    frame_lengths = frames - torch.randint(0, frames // 4 + 1, (size,), generator=g)
    label_lengths = symbols - torch.randint(0, symbols // 4 + 1, (size,), generator=g)
    frame_lengths[0], label_lengths[0] = frames, symbols
    mask = (torch.arange(frames)[None] < frame_lengths[:, None]).long()
    labels = torch.randint(1, vocab, (size, symbols), generator=g)
    labels[torch.arange(symbols)[None] >= label_lengths[:, None]] = -100
    return {"input_features": features.to(device), "attention_mask": mask.to(device), "labels": labels.to(device)}


def step(model: Transducer, inputs: dict[str, torch.Tensor]) -> float:
    for parameter in model.parameters():
        parameter.grad = None
    loss = model(**inputs)["loss"]
    loss.backward()
    return loss.item()


def measure(model: Transducer, inputs: dict[str, torch.Tensor], repeats: int) -> tuple[float, int]:
    """(median seconds, peak bytes) of a training step."""
    device = inputs["input_features"].device
    timed_peak(lambda: step(model, inputs), device)  # warm-up
    runs = [timed_peak(lambda: step(model, inputs), device) for _ in range(repeats)]
    return statistics.median(r[1] for r in runs), max(r[2] for r in runs)


def largest_batch(model: Transducer, args, device: torch.device) -> int:
    """The largest batch whose step peak stays within the budget (0 if not even 1 fits)."""
    budget = args.budget_mib * 2**20

    def fits(size: int) -> bool:
        inputs = batch(size, args.frames, args.symbols, args.vocab, device)
        return timed_peak(lambda: step(model, inputs), device)[2] <= budget

    low, high = 0, 1
    while high <= args.max_batch and fits(high):
        low, high = high, 2 * high
    high = min(high, args.max_batch + 1)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--frames", type=int, default=400)
    parser.add_argument("--symbols", type=int, default=40)
    parser.add_argument("--vocab", type=int, default=500)
    parser.add_argument("--budget-mib", type=int, default=1024)
    parser.add_argument("--max-batch", type=int, default=256)
    parser.add_argument("--group-budget-mib", type=int, default=32, help="sample-wise losses: bytes per group")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--losses", default=",".join(LOSS_KINDS))
    args = parser.parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"device: {name}; {args.size} Conformer; {args.frames} frames, {args.symbols} labels, vocab {args.vocab}; "
          f"torch {torch.__version__}\n")
    print(f"| loss | step s (batch {args.batch}) | peak MiB (batch {args.batch}) | largest batch in {args.budget_mib} MiB |")
    print("|---|---|---|---|")
    for loss in args.losses.split(","):
        torch.manual_seed(0)
        config = TransducerConfig.sized(args.size, vocab_size=args.vocab, loss=loss, warm_steps=0,
                                        samplewise_memory_budget=args.group_budget_mib * 2**20)
        model = Transducer(config).to(device).train()
        seconds, peak = measure(model, batch(args.batch, args.frames, args.symbols, args.vocab, device), args.repeats)
        print(f"| {loss} | {seconds:.3f} | {peak / 2**20:.1f} | {largest_batch(model, args, device)} |", flush=True)


if __name__ == "__main__":
    main()
