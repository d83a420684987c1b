"""float32 transducer gradients are as accurate as float32 allows: every loss's encoder and decoder
gradients within 5e-5 relative of float64 (issue figure: k2's fast_rnnt reaches ~2e-5; the lattice in
float32 gave 1e-4 to 5e-4). benchmarks/rnnt_precision.py prints the same errors beside k2's."""

import warnings

import pytest
import torch
from torch import nn

from asr.losses import Pruning, prune_ranges, pruned_rnnt_loss, rnnt_loss, samplewise_rnnt_loss, simple_rnnt_loss
from asr.losses.pruned import prune_decoder, pruned_transducer_losses
from joiners import TanhJoiner
from zoo.parity import relative_error

TOLERANCE = 5e-5
S_RANGE = 5
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERNEL_PROBLEM = (2, 200, 50, 64) if DEVICE == "cuda" else (2, 64, 20, 64)
"""(batch, frames, symbols, vocab) of the kernels' check: an eighth of the lattice under Triton's CPU
interpreter, which runs the kernels' float32 arithmetic in numpy (the torch path's check above
covers a lattice 20 times as large)."""


def problem(batch: int, frames: int, symbols: int, vocab: int, hidden: int = 32, device: str = "cpu"):
    """Inputs, lengths and modules drawn in float32 and held in float64 (both runs see the same values)."""
    g = torch.Generator().manual_seed(batch * frames + vocab)
    torch.manual_seed(0)
    modules = nn.ModuleDict({"joiner": TanhJoiner(hidden, hidden, hidden, vocab), "am": nn.Linear(hidden, vocab),
                             "lm": nn.Linear(hidden, vocab)}).double()
    frames_b = torch.randint(int(0.8 * frames), frames + 1, (batch,), generator=g)
    symbols_b = torch.randint(int(0.8 * symbols), symbols + 1, (batch,), generator=g)
    frames_b[0], symbols_b[0] = frames, symbols
    tensors = dict(enc=torch.randn(batch, frames, hidden, generator=g).double(),
                   dec=torch.randn(batch, symbols + 1, hidden, generator=g).double(),
                   targets=torch.randint(1, vocab, (batch, symbols), generator=g), logit_lengths=frames_b,
                   target_lengths=symbols_b)
    return {**{name: t.to(device) for name, t in tensors.items()}, "modules": modules.to(device)}


def windows(p, backend):
    """The windows the float32 simple loss picks: the pruned reference goes through the same ones."""
    m = p["modules"].float()
    _, posterior = simple_rnnt_loss(m["am"](p["enc"].float()), m["lm"](p["dec"].float()), p["targets"],
                                    p["logit_lengths"], p["target_lengths"], return_occupancies=True,
                                    backend=backend)
    p["modules"].double()
    return prune_ranges(posterior, p["logit_lengths"], p["target_lengths"], S_RANGE)


def summed_loss(kind, p, enc, dec, m, starts, backend, reference):
    targets, tl, ul = p["targets"], p["logit_lengths"], p["target_lengths"]
    if kind == "full" or (kind == "samplewise" and reference):
        return rnnt_loss(m["joiner"](enc[:, :, None], dec[:, None]), targets, tl, ul, reduction="sum", backend=backend)
    if kind == "samplewise":
        return samplewise_rnnt_loss(enc, dec, m["joiner"], targets, tl, ul, reduction="sum", group_size=2,
                                    backend=backend)
    simple = simple_rnnt_loss(m["am"](enc), m["lm"](dec), targets, tl, ul, reduction="sum", backend=backend)
    if kind == "simple":
        return simple
    if reference:
        joiner = m["joiner"]
        logits = joiner.out(torch.tanh(joiner.enc_proj(enc)[:, :, None] + prune_decoder(joiner.dec_proj(dec), starts, S_RANGE)))
        return 0.5 * simple + pruned_rnnt_loss(logits, targets, starts, tl, ul, reduction="sum", backend=backend)
    if kind == "pruned":
        joiner = m["joiner"]
        simple, pruned = pruned_transducer_losses(
            m["am"](enc), m["lm"](dec), joiner.enc_proj(enc), joiner.dec_proj(dec),
            lambda e, d: joiner.out(torch.tanh(e + d)), targets, tl, ul, S_RANGE, reduction="sum", backend=backend)
        return 0.5 * simple + pruned
    return samplewise_rnnt_loss(enc, dec, m["joiner"], targets, tl, ul, reduction="sum", group_size=2,
                                pruning=Pruning(S_RANGE, m["am"], m["lm"]), backend=backend)[0]


def gradient_errors(kind, p, backend="torch"):
    """Relative errors of the float32 encoder and decoder gradients against float64."""
    starts = windows(p, backend) if "pruned" in kind else None
    grads = []
    for dtype in (torch.float32, torch.float64):
        m = p["modules"].to(dtype)
        enc, dec = p["enc"].to(dtype).requires_grad_(), p["dec"].to(dtype).requires_grad_()
        loss = summed_loss(kind, p, enc, dec, m, starts, backend, reference=dtype == torch.float64)
        grads.append(torch.autograd.grad(loss, [enc, dec]))
    p["modules"].double()
    (enc32, dec32), (enc64, dec64) = grads
    return relative_error(enc32, enc64), relative_error(dec32, dec64)


@pytest.mark.parametrize("kind", ["full", "simple", "pruned", "samplewise", "samplewise_pruned"])
def test_float32_gradients_match_float64(kind):
    encoder_error, decoder_error = gradient_errors(kind, problem(4, 250, 55, 200))
    assert encoder_error < TOLERANCE and decoder_error < TOLERANCE, (encoder_error, decoder_error)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["simple", "pruned"])
def test_float32_gradients_match_float64_on_the_kernels(kind):
    with warnings.catch_warnings():  # the interpreter's log(0) = -inf warns through numpy
        warnings.filterwarnings("ignore", "divide by zero", RuntimeWarning)
        encoder_error, decoder_error = gradient_errors(kind, problem(*KERNEL_PROBLEM, device=DEVICE), backend="triton")
    assert encoder_error < TOLERANCE and decoder_error < TOLERANCE, (encoder_error, decoder_error)
