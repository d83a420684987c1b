"""Peak memory and time of transducer loss + all gradients: full vs pruned vs sample-wise vs both.

    python benchmarks/rnnt_losses.py [--shapes 8x200x100x500 ...] [--methods full,pruned,...] [--device cuda]

Each shape BxTxUxV runs every method on the same encoder output (B, T, H), decoder output (B, U+1, H)
and joiner out(tanh(enc_proj(enc) + dec_proj(dec))) of width --joiner-dim, in one process. A step
is the loss and the gradients of encoder_out, decoder_out and every parameter. Peak = the largest
total of tensor bytes alive at once beyond the inputs and parameters (trainers.memory.tensor_peak on CPU, the
CUDA allocator's peak above the inputs on a GPU), so the encoder/decoder gradients count for every
method; "working" is that peak less those two gradients (what the loss itself needs). Methods:
  full               joiner on (B, T, U+1), asr.losses.rnnt_loss (fused closed-form gradient written
                     into the joiner output, which nothing else holds: gradient_in_logits=True)
  autograd_log_softmax  the same lattice after an autograd log_softmax over V (the unfused peer)
  pruned             simple loss + pruned joiner on (B, T, s_range) (pruned_transducer_losses)
  samplewise         samplewise_rnnt_loss, one sample at a time (or groups within --memory-budget)
  samplewise_pruned  samplewise_rnnt_loss with Pruning
  torchaudio         joiner on (B, T, U+1), torchaudio.functional.rnnt_loss (only where it loads: GPU machines)
"""

from __future__ import annotations

import argparse
import importlib.util

import torch
from torch import nn

from asr.losses import Pruning, lattice_loss, pruned_transducer_losses, rnnt_loss, samplewise_rnnt_loss
from measure import timed_peak

SIMPLE_LOSS_SCALE = 0.5


class Joiner(nn.Module):
    def __init__(self, hidden: int, joiner_dim: int, vocab: int) -> None:
        super().__init__()
        self.enc_proj, self.dec_proj = nn.Linear(hidden, joiner_dim), nn.Linear(hidden, joiner_dim)
        self.out = nn.Linear(joiner_dim, vocab)

    def forward(self, enc: torch.Tensor, dec: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.enc_proj(enc) + self.dec_proj(dec)))

    def combine(self, enc_proj: torch.Tensor, dec_proj: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(enc_proj + dec_proj))


def full(batch, modules, args):
    enc, dec, targets, logit_lengths, target_lengths = batch
    logits = modules["joiner"](enc[:, :, None], dec[:, None])
    return rnnt_loss(logits, targets, logit_lengths, target_lengths, gradient_in_logits=True)


def autograd_log_softmax(batch, modules, args):
    enc, dec, targets, logit_lengths, target_lengths = batch
    log_probs = modules["joiner"](enc[:, :, None], dec[:, None]).float().log_softmax(-1)
    padded = torch.cat([targets, targets[:, :1]], dim=1)
    label = log_probs.gather(-1, padded[:, None, :, None].expand(-1, log_probs.shape[1], -1, -1))[..., 0]
    losses, _ = lattice_loss(log_probs[..., 0], label, logit_lengths, target_lengths)
    return losses.mean()


def torchaudio_full(batch, modules, args):
    import torchaudio

    enc, dec, targets, logit_lengths, target_lengths = batch
    logits = modules["joiner"](enc[:, :, None], dec[:, None])
    return torchaudio.functional.rnnt_loss(logits, targets.int(), logit_lengths.int(), target_lengths.int(), blank=0)


def pruned(batch, modules, args):
    enc, dec, targets, logit_lengths, target_lengths = batch
    joiner = modules["joiner"]
    simple, loss = pruned_transducer_losses(modules["am"](enc), modules["lm"](dec), joiner.enc_proj(enc),
                                            joiner.dec_proj(dec), joiner.combine, targets, logit_lengths,
                                            target_lengths, s_range=args.s_range)
    return SIMPLE_LOSS_SCALE * simple + loss


def samplewise(batch, modules, args):
    enc, dec, targets, logit_lengths, target_lengths = batch
    return samplewise_rnnt_loss(enc, dec, modules["joiner"], targets, logit_lengths, target_lengths,
                                memory_budget=args.memory_budget)


def samplewise_pruned(batch, modules, args):
    enc, dec, targets, logit_lengths, target_lengths = batch
    loss, _, _ = samplewise_rnnt_loss(enc, dec, modules["joiner"], targets, logit_lengths, target_lengths,
                                      pruning=Pruning(args.s_range, modules["am"], modules["lm"], SIMPLE_LOSS_SCALE),
                                      memory_budget=args.memory_budget)
    return loss


METHODS = {"full": full, "autograd_log_softmax": autograd_log_softmax, "pruned": pruned, "samplewise": samplewise, "samplewise_pruned": samplewise_pruned,
           "torchaudio": torchaudio_full}


def measure(method, batch, modules, args):
    """(loss, seconds, peak bytes above the inputs, that peak less the encoder/decoder output gradients)
    of one forward + backward."""
    parameters = [p for module in modules.values() for p in module.parameters()]
    for tensor in [*batch[:2], *parameters]:
        tensor.grad = None

    def step():
        loss = method(batch, modules, args)
        loss.backward()
        return loss

    loss, seconds, peak = timed_peak(step, batch[0].device)
    input_gradients = sum(t.grad.numel() * t.grad.element_size() for t in batch[:2])
    return loss.item(), seconds, peak, peak - input_gradients


def make_batch(shape, args, device, dtype):
    batch_size, frames, symbols, vocab = shape
    g = torch.Generator().manual_seed(0)
    enc = torch.randn(batch_size, frames, args.hidden, generator=g).to(device, dtype).requires_grad_()
    dec = torch.randn(batch_size, symbols + 1, args.hidden, generator=g).to(device, dtype).requires_grad_()
    targets = torch.randint(1, vocab, (batch_size, symbols), generator=g).to(device)
    # Lengths from 75% to 100% of the padded size, as in a batch of sorted utterances.
    logit_lengths = (frames - torch.randint(0, frames // 4 + 1, (batch_size,), generator=g)).clamp(min=1)
    target_lengths = (symbols - torch.randint(0, symbols // 4 + 1, (batch_size,), generator=g)).clamp(min=0)
    logit_lengths[0], target_lengths[0] = frames, symbols
    return enc, dec, targets, logit_lengths.to(device), target_lengths.to(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["8x100x50x500", "8x100x50x5000", "4x200x100x500"],
                        help="BxTxUxV")
    parser.add_argument("--methods",
                        default="full,autograd_log_softmax,pruned,samplewise,samplewise_pruned,torchaudio")
    parser.add_argument("--hidden", type=int, default=256, help="encoder/decoder output width H")
    parser.add_argument("--joiner-dim", type=int, default=256)
    parser.add_argument("--s-range", type=int, default=5)
    parser.add_argument("--memory-budget", type=int, default=None,
                        help="bytes per sample-wise group (default: one sample per group)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    methods = [m for m in args.methods.split(",") if m != "torchaudio" or _torchaudio_loads()]
    name = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    print(f"device {name}, torch {torch.__version__}, {args.dtype}, H {args.hidden}, joiner dim {args.joiner_dim}, "
          f"s_range {args.s_range}; peak = tensor bytes above inputs and parameters, gradients included\n")
    print("| B x T x U x V | method | loss | peak MiB | working MiB | seconds | peak / full |")
    print("|---|---|---|---|---|---|---|")
    for text in args.shapes:
        shape = tuple(int(v) for v in text.split("x"))
        torch.manual_seed(0)
        modules = {"joiner": Joiner(args.hidden, args.joiner_dim, shape[3]), "am": nn.Linear(args.hidden, shape[3]),
                   "lm": nn.Linear(args.hidden, shape[3])}
        modules = {k: m.to(args.device, dtype) for k, m in modules.items()}
        batch = make_batch(shape, args, args.device, dtype)
        reference = None
        for method in methods:
            try:
                loss, seconds, peak, working = measure(METHODS[method], batch, modules, args)
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                print(f"| {text} | {method} | out of memory | | | | |", flush=True)
                continue
            reference = peak if method == "full" else reference
            ratio = f"{peak / reference:.3f}" if reference else "-"
            print(f"| {text} | {method} | {loss:.4f} | {peak / 2**20:.1f} | {working / 2**20:.1f} | {seconds:.2f} "
                  f"| {ratio} |", flush=True)


def _torchaudio_loads() -> bool:
    if importlib.util.find_spec("torchaudio") is None:
        return False
    try:
        import torchaudio.functional  # noqa: F401
    except Exception:  # its CPU-machine wheel needs CUDA libraries; then it is not a peer here
        return False
    return True


if __name__ == "__main__":
    main()
