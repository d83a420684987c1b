"""The full RNN-T loss against a float64 brute force over every alignment, finite differences, and its
options and input checks."""

import math

import pytest
import torch

from asr.losses import lattice_loss, rnnt_loss
from reference import brute_force_nll
from zoo.parity import relative_error

LENGTHS = [  # (T, U, logit_lengths, target_lengths): variable lengths, U = 0 and T = 1 inside one batch
    (5, 3, [5, 1, 3, 4], [3, 2, 0, 1]),
    (1, 2, [1, 1], [2, 0]),
]


def batch(seed, frames, symbols, vocab, logit_lengths, target_lengths, blank, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(logit_lengths), frames, symbols + 1, vocab, generator=g, dtype=dtype) * 2
    symbols_ids = [v for v in range(vocab) if v != blank % vocab]
    targets = torch.tensor(symbols_ids)[torch.randint(0, vocab - 1, (len(logit_lengths), symbols), generator=g)]
    return logits, targets, torch.tensor(logit_lengths), torch.tensor(target_lengths)


def reference_losses(logits, targets, logit_lengths, target_lengths, blank, topology="regular", delay_penalty=0.0,
                     log_softmax=True):
    """(B,) brute-force losses, differentiable in logits."""
    losses = []
    for b in range(logits.shape[0]):
        t, u = int(logit_lengths[b]), int(target_lengths[b])
        scores = logits[b, :t, :u + 1]
        scores = scores.log_softmax(-1) if log_softmax else scores
        losses.append(brute_force_nll(scores, targets[b, :u].tolist(), blank % logits.shape[-1], topology,
                                      delay_penalty=delay_penalty))
    return torch.stack(losses)


@pytest.mark.parametrize("topology", ["regular", "modified"])
@pytest.mark.parametrize("blank", [0, -1])
@pytest.mark.parametrize("case", range(len(LENGTHS)))
def test_loss_and_gradient_equal_brute_force(topology, blank, case):
    frames, symbols, logit_lengths, target_lengths = LENGTHS[case]
    if topology == "modified":  # at most one symbol per frame: keep U_b <= T_b so that paths exist
        target_lengths = [min(u, t) for u, t in zip(target_lengths, logit_lengths)]
    logits, targets, logit_lengths, target_lengths = batch(case, frames, symbols, 7, logit_lengths, target_lengths,
                                                           blank)
    ours = logits.clone().requires_grad_()
    theirs = logits.clone().requires_grad_()
    weights = torch.rand(logits.shape[0], dtype=torch.float64) + 0.5
    loss = rnnt_loss(ours, targets, logit_lengths, target_lengths, blank=blank, reduction="none", topology=topology,
                     delay_penalty=0.25)
    expected = reference_losses(theirs, targets, logit_lengths, target_lengths, blank, topology, delay_penalty=0.25)
    (loss * weights).sum().backward()
    (expected * weights).sum().backward()
    assert relative_error(loss.detach(), expected.detach()) < 1e-13
    assert relative_error(ours.grad, theirs.grad) < 1e-12


@pytest.mark.parametrize("topology", ["regular", "modified"])
def test_unfused_log_softmax_takes_log_probabilities(topology):
    logits, targets, logit_lengths, target_lengths = batch(3, 4, 3, 6, [4, 3, 4], [3, 2, 1], 0)
    log_probs = logits.log_softmax(-1)
    ours = log_probs.clone().requires_grad_()
    theirs = log_probs.clone().requires_grad_()
    rnnt_loss(ours, targets, logit_lengths, target_lengths, reduction="sum", fused_log_softmax=False,
              topology=topology).backward()
    reference_losses(theirs, targets, logit_lengths, target_lengths, 0, topology, log_softmax=False).sum().backward()
    assert relative_error(ours.grad, theirs.grad) < 1e-12
    fused = rnnt_loss(logits, targets, logit_lengths, target_lengths, reduction="none", topology=topology)
    unfused = rnnt_loss(log_probs, targets, logit_lengths, target_lengths, reduction="none", fused_log_softmax=False,
                        topology=topology)
    assert relative_error(unfused, fused) < 1e-14


def test_gradient_matches_central_differences():
    """gradcheck's idea along random directions: torch.autograd.gradcheck itself runs backward twice per
    forward, which the in-place gradient buffer refuses (see test_backward_runs_once)."""
    logits, targets, logit_lengths, target_lengths = batch(4, 4, 3, 5, [4, 2, 3], [3, 1, 2], 0)
    x = logits.clone().requires_grad_()
    rnnt_loss(x, targets, logit_lengths, target_lengths, reduction="sum", delay_penalty=0.1).backward()
    g = torch.Generator().manual_seed(5)
    for _ in range(4):
        direction = torch.randn(logits.shape, generator=g, dtype=torch.float64)
        step = 1e-6
        plus = rnnt_loss(logits + step * direction, targets, logit_lengths, target_lengths, reduction="sum",
                         delay_penalty=0.1)
        minus = rnnt_loss(logits - step * direction, targets, logit_lengths, target_lengths, reduction="sum",
                          delay_penalty=0.1)
        numeric = (plus - minus).item() / (2 * step)
        assert abs(numeric - (x.grad * direction).sum().item()) < 1e-7 * max(1.0, abs(numeric))


@pytest.mark.parametrize("topology", ["regular", "modified"])
def test_lattice_loss_passes_gradcheck(topology):
    logits, targets, logit_lengths, target_lengths = batch(6, 4, 2, 5, [4, 3], [2, 1], 0)
    log_probs = logits.log_softmax(-1)
    blank = log_probs[..., 0].clone().requires_grad_()
    label = log_probs[..., 1].clone().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda b, y: lattice_loss(b, y, logit_lengths, target_lengths, topology)[0], (blank, label))


def test_reductions_and_clamp():
    logits, targets, logit_lengths, target_lengths = batch(7, 5, 3, 6, [5, 4, 2], [3, 3, 1], 0)
    none = rnnt_loss(logits, targets, logit_lengths, target_lengths, reduction="none")
    assert torch.allclose(rnnt_loss(logits, targets, logit_lengths, target_lengths), none.mean(), rtol=1e-15)
    assert torch.allclose(rnnt_loss(logits, targets, logit_lengths, target_lengths, reduction="sum"), none.sum(),
                          rtol=1e-15)
    free, clamped = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    rnnt_loss(free, targets, logit_lengths, target_lengths, reduction="sum").backward()
    rnnt_loss(clamped, targets, logit_lengths, target_lengths, reduction="sum", clamp=0.05).backward()
    assert free.grad.abs().max() > 0.2
    assert torch.equal(clamped.grad, free.grad.clamp(-0.05, 0.05))


def test_gradient_in_logits_overwrites_them_with_the_same_gradient():
    logits, targets, logit_lengths, target_lengths = batch(8, 4, 3, 6, [4, 3], [3, 2], 0, dtype=torch.float32)
    kept = logits.clone().requires_grad_()
    rnnt_loss(kept, targets, logit_lengths, target_lengths).backward()
    reused = logits.clone().requires_grad_()
    storage = reused.data_ptr()
    loss = rnnt_loss(reused, targets, logit_lengths, target_lengths, gradient_in_logits=True)
    loss.backward()
    assert reused.grad.data_ptr() == storage
    assert torch.equal(reused.grad, kept.grad)


def test_backward_runs_once():
    logits, targets, logit_lengths, target_lengths = batch(9, 3, 2, 5, [3], [2], 0)
    loss = rnnt_loss(logits.requires_grad_(), targets, logit_lengths, target_lengths)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward can run only once"):
        loss.backward()


@pytest.mark.parametrize("zero_infinity", [False, True])
def test_impossible_alignments(zero_infinity):
    logits, targets, logit_lengths, target_lengths = batch(10, 3, 4, 6, [3, 3], [4, 2], 0)
    logits = logits.requires_grad_()
    # modified topology: one symbol per frame at most, so 4 symbols in 3 frames have no path
    loss = rnnt_loss(logits, targets, logit_lengths, target_lengths, reduction="none", topology="modified",
                     zero_infinity=zero_infinity)
    assert (loss[0].item() == 0.0) if zero_infinity else math.isinf(loss[0].item())
    assert math.isfinite(loss[1].item())
    loss.sum().backward()
    if zero_infinity:
        assert logits.grad[0].abs().max() == 0 and logits.grad[1].abs().max() > 0


def test_low_precision_logits_give_a_float32_loss_from_the_float64_lattice():
    logits, targets, logit_lengths, target_lengths = batch(11, 6, 4, 50, [6, 5], [4, 3], 0)
    expected = rnnt_loss(logits, targets, logit_lengths, target_lengths, reduction="none")
    x = logits.to(torch.bfloat16).requires_grad_()
    loss = rnnt_loss(x, targets, logit_lengths, target_lengths, reduction="none")
    loss.sum().backward()
    assert loss.dtype == torch.float32 and x.grad.dtype == torch.bfloat16
    assert relative_error(loss, expected) < 2e-3


def test_bad_inputs_are_named():
    logits, targets, logit_lengths, target_lengths = batch(12, 4, 3, 6, [4, 3], [3, 2], 0)
    cases = [
        (dict(logit_lengths=torch.tensor([5, 3])), "logit_lengths must lie in \\[1, 4\\]"),
        (dict(logit_lengths=torch.tensor([0, 3])), "logit_lengths must lie in"),
        (dict(target_lengths=torch.tensor([-1, 2])), "target_lengths must lie in \\[0, 3\\]"),
        (dict(target_lengths=torch.tensor([4, 2])), "target_lengths must lie in"),
        (dict(targets=targets.masked_fill(targets == targets[1, 1], 0)), "must not contain the blank id 0"),
        (dict(targets=targets.float()), "targets must be int32 or int64"),
        (dict(targets=targets[:, :2]), "targets must have shape \\(2, 3\\)"),
        (dict(logit_lengths=logit_lengths.to("meta")), "logit_lengths must be on logits's device"),
        (dict(logits=logits[0]), "logits must have shape \\(B, T, U\\+1, V\\)"),
        (dict(logits=logits.long()), "logits must be a floating-point tensor"),
        (dict(blank=6), "blank must lie in \\[-V, V\\)"),
        (dict(reduction="avg"), "reduction must be one of"),
        (dict(targets=targets.masked_fill(targets == targets[0, 0], 9)), "targets must be symbol ids in \\[0, 6\\)"),
    ]
    for change, message in cases:
        arguments = dict(logits=logits, targets=targets, logit_lengths=logit_lengths, target_lengths=target_lengths)
        arguments.update(change)
        with pytest.raises((ValueError, TypeError), match=message):
            rnnt_loss(**arguments)
