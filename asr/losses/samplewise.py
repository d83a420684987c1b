"""Sample-wise transducer loss (Braun et al., 2022): the joiner runs on one group of samples at a time.

The forward pass takes, group by group, the encoder and decoder rows of the group, runs the joiner and
the fused loss on them, and immediately back-propagates into the group's encoder/decoder rows and the
joiner's parameters; then the group's joiner output is freed. Only one group's (G, T_g, U_g+1, V)
tensor is ever alive, so the peak does not grow with the batch. The gradients wait in buffers of the
size of encoder_out, decoder_out and the parameters; `backward()` scales them by the incoming gradient
and hands them on, so the encoder and decoder continue the backward pass as usual and the joiner's
parameter gradients accumulate in `.grad` like any other.

With `Pruning`, each group also computes the simple loss (through the given projections), prunes, and
runs the joiner on the (G, T_g, S) windows only: sample-wise + pruned.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.nn.modules import module as module_hooks

from asr.losses.checks import check_choice, check_transducer_inputs, resolve_blank
from asr.losses.pruned import check_s_range, prune_decoder, prune_ranges
from asr.losses.rnnt import LossOptions, transducer_loss
from asr.losses.simple import simple_rnnt_loss

LATTICE_BYTES_PER_CELL = 160
"""Bytes per (t, u) cell of the lattice tensors alive at once (an upper bound): the float64 weights,
skewed alpha/beta and occupancies, and the row passes' per-row normaliser parts, node and exact entries."""


@dataclass
class Pruning:
    """Sample-wise + pruned: how each group computes its simple loss and windows."""

    s_range: int
    """Window width S (lattice columns per frame)."""
    simple_am: nn.Module
    """Encoder's simple projection: (..., H_enc) -> (..., V)."""
    simple_lm: nn.Module
    """Decoder's simple projection: (..., H_dec) -> (..., V)."""
    simple_loss_scale: float = 0.5
    """Weight of the simple loss in the returned loss: loss = simple_loss_scale * simple + pruned.
    (One weighted loss keeps one set of gradient buffers; icefall warms this weight up over training.)"""


def joiner_bytes_per_cell(joiner: nn.Module, encoder_out: torch.Tensor, decoder_out: torch.Tensor) -> int:
    """Bytes one lattice cell costs in a group (an upper bound): what the joiner saves for backward on a
    1 x 1 probe (parameters aside), its output (which then holds its gradient), the lattice tensors."""
    enc = encoder_out[:1, :1, None].detach().requires_grad_()
    dec = decoder_out[:1, None, :1].detach().requires_grad_()
    parameters = {p.data_ptr() for p in joiner.parameters()}
    saved = []

    def count(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.data_ptr() not in parameters:
            saved.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
        logits = joiner(enc, dec)
    return sum(saved) + logits.numel() * logits.element_size() + LATTICE_BYTES_PER_CELL


def plan_groups(cells: torch.Tensor, frames: torch.Tensor, columns: torch.Tensor, group_size: int | None,
                memory_budget: int | None, bytes_per_cell: int) -> list[torch.Tensor]:
    """Split the batch into groups of sample indices: `group_size` samples each, or as many as keep
    (G x max T_g x max columns_g x bytes_per_cell) within `memory_budget` bytes (a sample alone may
    exceed it). Samples are taken in order of size so that groups pad little. cells, frames, columns: (B,)."""
    order = torch.argsort(cells, stable=True).tolist()
    if memory_budget is None:
        size = group_size or 1
        return [torch.tensor(order[i:i + size]) for i in range(0, len(order), size)]
    groups, current, longest, widest = [], [], 0, 0
    for index in order:
        t, c = max(longest, int(frames[index])), max(widest, int(columns[index]))
        if current and (len(current) + 1) * t * c * bytes_per_cell > memory_budget:
            groups.append(torch.tensor(current))
            current, t, c = [], int(frames[index]), int(columns[index])
        current.append(index)
        longest, widest = t, c
    groups.append(torch.tensor(current))
    return groups


@contextmanager
def _global_module_hooks_suspended():
    """Run without the global module forward hooks. Trackers that follow the module hierarchy
    through backward (torch's ModTracker, hence MemTracker and the trainer's memory probe) assume
    that backward comes after forward; a group's backward inside the forward pass breaks their
    bookkeeping. Its tensors are still seen by tensor-level trackers."""
    hooks = (module_hooks._global_forward_pre_hooks, module_hooks._global_forward_hooks,
             module_hooks._global_forward_hooks_always_called, module_hooks._global_forward_hooks_with_kwargs)
    saved = [dict(table) for table in hooks]
    for table in hooks:
        table.clear()
    try:
        yield
    finally:
        for table, entries in zip(hooks, saved):
            table.update(entries)


class _SamplewiseLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, encoder_out, decoder_out, run, *parameters):
        ctx.gradients = run.gradients(encoder_out, decoder_out, parameters)
        return run.totals[0]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_total):
        if ctx.gradients is None:
            raise RuntimeError("the sample-wise loss scales its gradient buffers in place: backward runs once")
        gradients, ctx.gradients = ctx.gradients, None
        scaled = [None if g is None else g.mul_(grad_total.to(g.dtype)) for g in gradients]
        return scaled[0], scaled[1], None, *scaled[2:]


@dataclass
class _SamplewiseRun:
    joiner: nn.Module
    targets: torch.Tensor
    logit_lengths: torch.Tensor
    target_lengths: torch.Tensor
    groups: list
    options: LossOptions
    scale: float
    pruning: Pruning | None

    def __post_init__(self):
        self.totals = []

    def gradients(self, encoder_out, decoder_out, parameters):
        """Gradient buffers for (encoder_out, decoder_out, *parameters) of the loss; the loss and, with
        pruning, its simple and pruned parts go to self.totals. All are scaled by `scale`."""
        gradients = [torch.zeros_like(encoder_out), torch.zeros_like(decoder_out)] + [None] * len(parameters)
        dtype = torch.promote_types(encoder_out.dtype, torch.float32)
        totals = encoder_out.new_zeros(1 if self.pruning is None else 3, dtype=dtype)
        for group in self.groups:
            group = group.to(encoder_out.device)
            frames, symbols = int(self.logit_lengths[group].max()), int(self.target_lengths[group].max())
            enc = encoder_out[group, :frames].detach().requires_grad_()
            dec = decoder_out[group, :symbols + 1].detach().requires_grad_()
            with torch.enable_grad(), _global_module_hooks_suspended():
                losses = self._group_losses(enc, dec, group, frames, symbols)
            grads = torch.autograd.grad(losses[0], [enc, dec, *parameters], losses[0].new_tensor(self.scale),
                                        allow_unused=True)
            totals += torch.stack([loss.detach() for loss in losses])
            gradients[0][group, :frames] += grads[0]
            gradients[1][group, :symbols + 1] += grads[1]
            for i, grad in enumerate(grads[2:], start=2):
                if grad is not None:
                    gradients[i] = grad if gradients[i] is None else gradients[i].add_(grad)
        self.totals = list(totals * self.scale)
        return gradients

    def _group_losses(self, enc, dec, group, frames, symbols):
        targets = self.targets[group, :symbols]
        logit_lengths, target_lengths = self.logit_lengths[group], self.target_lengths[group]
        if self.pruning is None:
            logits = self.joiner(enc[:, :, None], dec[:, None])
            return (transducer_loss(logits, targets, logit_lengths, target_lengths, None, symbols + 1, self.options,
                                    "sum"),)
        s_range, options = self.pruning.s_range, self.options
        simple, posterior = simple_rnnt_loss(self.pruning.simple_am(enc), self.pruning.simple_lm(dec), targets,
                                             logit_lengths, target_lengths, options.blank, "sum",
                                             options.delay_penalty, options.zero_infinity, options.topology,
                                             options.backend, return_occupancies=True)
        starts = prune_ranges(posterior, logit_lengths, target_lengths, s_range, options.topology)
        logits = self.joiner(enc[:, :, None], prune_decoder(dec, starts, s_range))
        pruned = transducer_loss(logits, targets, logit_lengths, target_lengths, starts, symbols + 1, options, "sum")
        return self.pruning.simple_loss_scale * simple + pruned, simple, pruned


def samplewise_rnnt_loss(encoder_out: torch.Tensor, decoder_out: torch.Tensor, joiner: nn.Module,
                         targets: torch.Tensor, logit_lengths: torch.Tensor, target_lengths: torch.Tensor,
                         blank: int = 0, reduction: str = "mean", group_size: int | None = None,
                         memory_budget: int | None = None, pruning: Pruning | None = None, clamp: float | None = None,
                         delay_penalty: float = 0.0, zero_infinity: bool = False, topology: str = "regular",
                         backend: str | None = None):
    """The RNN-T loss computed a group of samples at a time (see the module docstring).

    Args:
        encoder_out: (B, T, H_enc) encoder output; decoder_out: (B, U+1, H_dec) prediction network output.
        joiner: module with joiner(enc (G, T, 1, H_enc), dec (G, 1, U+1, H_dec)) -> (G, T, U+1, V),
            broadcasting over the two singleton dimensions (with pruning: dec (G, T, S, H_dec)).
        targets (B, U), logit_lengths (B,), target_lengths (B,), blank, clamp, delay_penalty,
            zero_infinity, topology, backend: as in `rnnt_loss`.
        reduction: "mean" (over the batch) or "sum". ("none" cannot be: the joiner's parameter
            gradients are summed over the samples during the forward pass.)
        group_size: samples per group (1 when neither this nor memory_budget is given).
        memory_budget: bytes one group may use for its joiner activations, output, output gradient and
            lattice; groups are packed up to it (estimated with a 1 x 1 probe of the joiner).
        pruning: compute the simple loss and the pruned loss per group instead of the full loss.

    Returns:
        The loss; with pruning, (loss, simple_loss, pruned_loss) where loss = pruning.simple_loss_scale
        * simple_loss + pruned_loss and the two parts are detached, for logging. `backward()` on the
        loss sends the gradients into encoder_out, decoder_out and the joiner's (and projections')
        parameters; it may run once.
    """
    check_choice("reduction", reduction, ("mean", "sum"))
    if encoder_out.dim() != 3 or decoder_out.dim() != 3 or encoder_out.shape[0] != decoder_out.shape[0]:
        raise ValueError(f"encoder_out must be (B, T, H) and decoder_out (B, U+1, H); got "
                         f"{tuple(encoder_out.shape)} and {tuple(decoder_out.shape)}")
    if group_size is not None and group_size < 1:
        raise ValueError(f"group_size must be >= 1; got {group_size}")
    with torch.no_grad():
        probe = joiner(encoder_out[:1, :1, None].detach(), decoder_out[:1, None, :1].detach())
    vocab = probe.shape[-1]
    blank = resolve_blank(blank, vocab)
    batch, frames, _ = encoder_out.shape
    check_transducer_inputs(encoder_out, frames, decoder_out.shape[1], vocab, targets, logit_lengths, target_lengths,
                            blank, reduction, topology, "encoder_out", ("decoder_out", decoder_out))
    modules = [joiner] if pruning is None else [joiner, pruning.simple_am, pruning.simple_lm]
    if pruning is not None:
        check_s_range(pruning.s_range, logit_lengths, target_lengths, topology)
    columns = target_lengths + 1 if pruning is None else torch.full_like(target_lengths, pruning.s_range)
    bytes_per_cell = joiner_bytes_per_cell(joiner, encoder_out, decoder_out) if memory_budget is not None else 0
    groups = plan_groups(logit_lengths * columns, logit_lengths, columns, group_size, memory_budget, bytes_per_cell)
    # The group's logits are the joiner's output, held by nobody else: their storage takes the gradient.
    options = LossOptions(blank, clamp, True, delay_penalty, zero_infinity, topology, True, backend)
    parameters = list({id(p): p for module in modules for p in module.parameters() if p.requires_grad}.values())
    run = _SamplewiseRun(joiner, targets, logit_lengths.long(), target_lengths.long(), groups, options,
                         1.0 / batch if reduction == "mean" else 1.0, pruning)
    loss = _SamplewiseLoss.apply(encoder_out, decoder_out, run, *parameters)
    return loss if pruning is None else (loss, run.totals[1], run.totals[2])
