"""How accurate are the transducer losses' float32 gradients? Relative error against float64, beside k2.

    python benchmarks/rnnt_precision.py [--shapes 2x200x50x64 ...] [--hidden 64] [--joiner-dim 64] [--device cuda]

Each shape BxTxUxV draws encoder output (B, T, H), decoder output (B, U+1, H), targets and lengths
(T_b in [0.8 T, T], U_b in [0.8 U, U]), and a tanh joiner (benchmarks/rnnt_losses.py) plus the simple
projections H -> V. Every loss runs twice on the same values: once in float32, once with inputs and
modules in float64 (the reference). A row gives the relative error ||g32 - g64|| / ||g64|| of the
gradients of encoder_out and decoder_out, and of the loss. Methods (all with reduction "sum"):
  full               rnnt_loss on the joiner output (B, T, U+1, V)
  simple             simple_rnnt_loss on the additive projections
  pruned             0.5 x simple + pruned loss (pruned_transducer_losses, S = --s-range)
  samplewise         samplewise_rnnt_loss, one sample at a time
  samplewise_pruned  samplewise_rnnt_loss with Pruning
  k2_full, k2_simple, k2_pruned  k2's fast_rnnt (rnnt_loss, rnnt_loss_simple, 0.5 x simple +
                     rnnt_loss_pruned), where `import fast_rnnt` works
Pruning is a discrete choice (an argmax over window sums that a 1e-7 difference can flip between
near-equal windows), so the pruned references use the windows that the float32 run chose: the float64
simple loss plus the float64 pruned loss through those windows (the sample-wise loss's: chosen sample
by sample). k2's pruned rows use the same windows.
"""

from __future__ import annotations

import argparse
import importlib.util

import torch
from torch import nn

from asr.losses import (Pruning, prune_ranges, pruned_rnnt_loss, pruned_transducer_losses, rnnt_loss,
                        samplewise_rnnt_loss, simple_rnnt_loss)
from asr.losses.pruned import prune_decoder
from rnnt_losses import Joiner

SIMPLE_LOSS_SCALE = 0.5
METHODS = ("full", "simple", "pruned", "samplewise", "samplewise_pruned", "k2_full", "k2_simple", "k2_pruned")


def make_problem(shape: tuple[int, int, int, int], hidden: int, joiner_dim: int, device: str, seed: int = 0):
    """Inputs and modules of one shape: drawn in float32 and held in float64, so that both runs
    start from the same values."""
    batch, frames, symbols, vocab = shape
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    modules = nn.ModuleDict({"joiner": Joiner(hidden, joiner_dim, vocab), "am": nn.Linear(hidden, vocab),
                             "lm": nn.Linear(hidden, vocab)}).double()
    tensors = {
        "enc": torch.randn(batch, frames, hidden, generator=g).double(),
        "dec": torch.randn(batch, symbols + 1, hidden, generator=g).double(),
        "targets": torch.randint(1, vocab, (batch, symbols), generator=g),
        "logit_lengths": torch.randint(int(0.8 * frames), frames + 1, (batch,), generator=g).index_fill(0, torch.tensor([0]), frames),
        "target_lengths": torch.randint(int(0.8 * symbols), symbols + 1, (batch,), generator=g).index_fill(0, torch.tensor([0]), symbols),
    }
    return {**{name: t.to(device) for name, t in tensors.items()}, "modules": modules.to(device)}


def float32_windows(problem, s_range: int, per_sample: bool) -> torch.Tensor:
    """(B, T) window starts that the float32 simple loss chooses: on the whole batch, or
    (`per_sample`, as the sample-wise loss runs it) on each sample cut to its own lengths, whose
    float32 sums can differ from the batch's in the last bits (on a GPU they do) and flip a near-tie."""
    m = problem["modules"].float()
    enc, dec = problem["enc"].float(), problem["dec"].float()
    targets, logit_lengths, target_lengths = problem["targets"], problem["logit_lengths"], problem["target_lengths"]
    pieces = [(slice(b, b + 1), int(logit_lengths[b]), int(target_lengths[b])) for b in range(len(targets))] \
        if per_sample else [(slice(None), enc.shape[1], targets.shape[1])]
    starts = torch.zeros(enc.shape[:2], dtype=torch.long, device=enc.device)
    with torch.no_grad():
        for rows, frames, symbols in pieces:
            _, posterior = simple_rnnt_loss(m["am"](enc[rows, :frames]), m["lm"](dec[rows, :symbols + 1]),
                                            targets[rows, :symbols], logit_lengths[rows], target_lengths[rows],
                                            reduction="sum", return_occupancies=True)
            starts[rows, :frames] = prune_ranges(posterior, logit_lengths[rows], target_lengths[rows], s_range)
    problem["modules"].double()
    return starts


def k2_boundary(p) -> torch.Tensor:
    """k2's (B, 4) boundary [0, 0, U_b, T_b]."""
    zeros = torch.zeros_like(p["logit_lengths"])
    return torch.stack([zeros, zeros, p["target_lengths"], p["logit_lengths"]], dim=1)


def loss_of(method: str, p, enc, dec, m, starts, s_range: int, reference: bool) -> torch.Tensor:
    """The summed loss of `method`; with `reference`, the float64 loss it is compared against."""
    targets, tl, ul = p["targets"], p["logit_lengths"], p["target_lengths"]
    family = method.removeprefix("k2_")
    if method.startswith("k2_") and not reference:
        import fast_rnnt

        boundary = k2_boundary(p)
        simple = fast_rnnt.rnnt_loss_simple(m["lm"](dec), m["am"](enc), targets, 0, boundary, reduction="sum")
        if family == "simple":
            return simple
        if family == "full":
            return fast_rnnt.rnnt_loss(m["joiner"](enc[:, :, None], dec[:, None]), targets, 0, boundary, reduction="sum")
        ranges = starts[:, :, None] + torch.arange(s_range, device=starts.device)
        logits = m["joiner"].combine(m["joiner"].enc_proj(enc)[:, :, None],
                                     prune_decoder(m["joiner"].dec_proj(dec), starts, s_range))
        return SIMPLE_LOSS_SCALE * simple + fast_rnnt.rnnt_loss_pruned(logits, targets, ranges, 0, boundary, reduction="sum")
    if family in ("full", "samplewise") and (reference or family == "full"):
        return rnnt_loss(m["joiner"](enc[:, :, None], dec[:, None]), targets, tl, ul, reduction="sum")
    if family == "samplewise":
        return samplewise_rnnt_loss(enc, dec, m["joiner"], targets, tl, ul, reduction="sum", group_size=1)
    simple = simple_rnnt_loss(m["am"](enc), m["lm"](dec), targets, tl, ul, reduction="sum")
    if family == "simple":
        return simple
    if reference:  # the pruned losses: the float64 loss through the float32 run's windows
        logits = m["joiner"].combine(m["joiner"].enc_proj(enc)[:, :, None],
                                     prune_decoder(m["joiner"].dec_proj(dec), starts, s_range))
        return SIMPLE_LOSS_SCALE * simple + pruned_rnnt_loss(logits, targets, starts, tl, ul, reduction="sum")
    if family == "pruned":
        simple, pruned = pruned_transducer_losses(m["am"](enc), m["lm"](dec), m["joiner"].enc_proj(enc),
                                                  m["joiner"].dec_proj(dec), m["joiner"].combine, targets, tl, ul,
                                                  s_range, reduction="sum")
        return SIMPLE_LOSS_SCALE * simple + pruned
    pruning = Pruning(s_range, m["am"], m["lm"], simple_loss_scale=SIMPLE_LOSS_SCALE)
    return samplewise_rnnt_loss(enc, dec, m["joiner"], targets, tl, ul, reduction="sum", group_size=1,
                                pruning=pruning)[0]


def gradients(method: str, problem, dtype: torch.dtype, starts, s_range: int, reference: bool):
    """(loss, d loss / d encoder_out, d loss / d decoder_out) in float64."""
    m = problem["modules"].to(dtype)
    enc = problem["enc"].to(dtype).requires_grad_()
    dec = problem["dec"].to(dtype).requires_grad_()
    loss = loss_of(method, problem, enc, dec, m, starts, s_range, reference)
    grad_enc, grad_dec = torch.autograd.grad(loss, [enc, dec])
    problem["modules"].double()
    return loss.double().item(), grad_enc.double(), grad_dec.double()


def relative(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).norm() / expected.norm()).item()


def precision_row(method: str, problem, s_range: int) -> dict[str, float]:
    """Relative errors of the float32 loss and gradients of `method` against its float64 reference."""
    starts = float32_windows(problem, s_range, method.startswith("samplewise")) if "pruned" in method else None
    loss32, enc32, dec32 = gradients(method, problem, torch.float32, starts, s_range, reference=False)
    loss64, enc64, dec64 = gradients(method, problem, torch.float64, starts, s_range, reference=True)
    return {"loss": abs(loss32 - loss64) / abs(loss64), "encoder": relative(enc32, enc64),
            "decoder": relative(dec32, dec64)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["2x200x50x64", "4x250x55x200", "8x300x60x500"])
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--joiner-dim", type=int, default=64)
    parser.add_argument("--s-range", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="cuda runs the Triton kernels")
    args = parser.parse_args()
    methods = args.methods.split(",")
    if any(m.startswith("k2_") for m in methods) and importlib.util.find_spec("fast_rnnt") is None:
        print("fast_rnnt does not import here: k2 rows left out")
        methods = [m for m in methods if not m.startswith("k2_")]
    print("| shape BxTxUxV | method | encoder grad rel. error | decoder grad rel. error | loss rel. error |")
    print("|---|---|---|---|---|")
    for shape in args.shapes:
        problem = make_problem(tuple(int(x) for x in shape.split("x")), args.hidden, args.joiner_dim, args.device)
        for method in methods:
            row = precision_row(method, problem, args.s_range)
            print(f"| {shape} | {method} | {row['encoder']:.1e} | {row['decoder']:.1e} | {row['loss']:.1e} |", flush=True)


if __name__ == "__main__":
    main()
