"""Fused linear + cross-entropy against a float64 `F.cross_entropy(x @ W.T)` reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trainers.memory.tensor_peak import TensorPeak
from trainers.memory.saved_activations import SavedActivations
from zoo.nn import linear_cross_entropy
from zoo.nn.cross_entropy import current_loss_gradients, loss_gradients
from zoo.parity import relative_error


def inputs(tokens=37, hidden=16, vocab=50, dtype=torch.float32, bias=True, seed=0):
    generator = torch.Generator().manual_seed(seed)
    h = torch.randn(tokens, hidden, generator=generator).to(dtype).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=generator) / hidden**0.5).to(dtype).requires_grad_()
    b = (torch.randn(vocab, generator=generator) * 0.1).to(dtype).requires_grad_() if bias else None
    y = torch.randint(0, vocab, (tokens,), generator=generator)
    y[::5] = -100
    return h, w, b, y


def reference(h, w, b, y, **kwargs):
    h64, w64 = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    b64 = None if b is None else b.detach().double().requires_grad_()
    logits = h64 @ w64.T + (0 if b64 is None else b64)
    loss = F.cross_entropy(logits, y, **kwargs)
    loss.backward()
    return loss, h64.grad, w64.grad, None if b64 is None else b64.grad


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("chunk_size", [1, 8, 1000])
@pytest.mark.parametrize("gradients", ["forward", "backward"])
def test_loss_and_gradients_match_float64(reduction, label_smoothing, chunk_size, gradients):
    h, w, b, y = inputs(seed=chunk_size)
    loss = linear_cross_entropy(h, w, y, b, reduction=reduction, label_smoothing=label_smoothing, chunk_size=chunk_size,
                                gradients=gradients)
    (loss * 1.7).backward()
    ref_loss, ref_h, ref_w, ref_b = reference(h, w, b, y, reduction=reduction, label_smoothing=label_smoothing)
    assert relative_error(loss, ref_loss) < 1e-6
    assert relative_error(h.grad, 1.7 * ref_h) < 1e-5
    assert relative_error(w.grad, 1.7 * ref_w) < 1e-5
    assert relative_error(b.grad, 1.7 * ref_b) < 1e-5
    assert h.grad[::5].abs().max() == 0  # ignored tokens get no gradient


@pytest.mark.parametrize("gradients", ["forward", "backward"])
def test_without_bias_and_with_frozen_weight(gradients):
    h, w, _, y = inputs(bias=False)
    w.requires_grad_(False)
    linear_cross_entropy(h, w, y, gradients=gradients).backward()
    _, ref_h, _, _ = reference(h, w, None, y)
    assert w.grad is None and relative_error(h.grad, ref_h) < 1e-5


@pytest.mark.parametrize("gradients", ["forward", "backward"])
def test_bfloat16_within_bfloat16_tolerance(gradients):
    h, w, b, y = inputs(tokens=64, hidden=32, vocab=300, dtype=torch.bfloat16)
    loss = linear_cross_entropy(h, w, y, b, chunk_size=16, gradients=gradients)
    loss.backward()
    ref_loss, ref_h, ref_w, ref_b = reference(h, w, b, y)
    assert loss.dtype == torch.float32 and relative_error(loss, ref_loss) < 1e-2
    assert h.grad.dtype == torch.bfloat16 and relative_error(h.grad, ref_h) < 2e-2
    assert relative_error(w.grad, ref_w) < 2e-2 and relative_error(b.grad, ref_b) < 2e-2


def test_logits_are_never_materialised():
    """Saved tensors are the gradient buffers only: no (N, V) tensor survives the forward."""
    h, w, b, y = inputs(tokens=256, hidden=16, vocab=1000)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        linear_cross_entropy(h, w, y, b, chunk_size=32)
    assert (256, 1000) not in saved


def test_backward_scales_the_gradients_from_forward_in_place():
    """Backward makes no second copy of the gradients that forward formed: the weight's, V x H,
    is the largest tensor of a language model's loss (196 MiB at GPT-2's vocabulary, width 1024)."""
    h, w, b, y = inputs(tokens=64, hidden=64, vocab=4000)
    loss = linear_cross_entropy(h, w, y, b, chunk_size=16)
    with TensorPeak() as backward:
        (loss * 1.7).backward()
    _, ref_h, ref_w, ref_b = reference(h, w, b, y)
    assert relative_error(w.grad, 1.7 * ref_w) < 1e-5 and relative_error(h.grad, 1.7 * ref_h) < 1e-5
    assert backward.peak < w.grad.nbytes / 4  # the weight's gradient is the buffer forward saved


def test_gradients_in_backward_keep_nothing_vocabulary_sized():
    """Formed in backward, the gradients leave forward holding one float32 per token besides the
    inputs; formed in forward, the (V, H) float32 weight gradient (and hidden's) waits for backward."""
    h, w, b, y = inputs(tokens=64, hidden=64, vocab=4000)
    held = {}
    for when in ("forward", "backward"):
        with SavedActivations(exclude=[w, b, h, y]) as saved:
            linear_cross_entropy(h, w, y, b, chunk_size=16, gradients=when)
        held[when] = saved.bytes
    assert held["backward"] <= 64 * 4 + 4  # the log-sum-exps and the mean's scale
    assert held["forward"] >= w.nbytes + h.nbytes


def test_the_trainer_chooses_when_through_a_context():
    h, w, b, y = inputs()
    assert current_loss_gradients() == "forward"
    with loss_gradients("backward"):
        assert current_loss_gradients() == "backward"
        with SavedActivations(exclude=[w, b, h, y]) as saved:
            linear_cross_entropy(h, w, y, b)
        assert saved.bytes == h.shape[0] * 4 + 4
    assert current_loss_gradients() == "forward"
    with pytest.raises(ValueError, match=r"loss gradients must be formed in one of \('forward', 'backward'\); got 'later'"):
        with loss_gradients("later"):
            pass


@pytest.mark.parametrize("gradients", ["forward", "backward"])
def test_a_backward_that_keeps_the_graph_can_run_again(gradients):
    """With retain_graph=True the saved gradients are scaled as copies: a second backward reads
    them unchanged (and in a zero-bubble schedule, the weight pass after the input pass)."""
    h, w, b, y = inputs()
    loss = linear_cross_entropy(h, w, y, b, chunk_size=8, gradients=gradients)
    (loss * 1.7).backward(retain_graph=True)
    (loss * 0.3).backward()
    _, ref_h, ref_w, ref_b = reference(h, w, b, y)
    assert relative_error(w.grad, 2.0 * ref_w) < 1e-5 and relative_error(h.grad, 2.0 * ref_h) < 1e-5
    assert relative_error(b.grad, 2.0 * ref_b) < 1e-5


def test_bad_input_is_named():
    h, w, b, y = inputs()
    with pytest.raises(ValueError, match=r"hidden must be \(N, H\) and weight \(V, H\) with the same H; got \(37, 16\) and \(50, 8\)"):
        linear_cross_entropy(h, w[:, :8], y)
    with pytest.raises(ValueError, match=r"labels must have shape \(N,\) = \(37,\); got \(36,\)"):
        linear_cross_entropy(h, w, y[:-1])
    with pytest.raises(TypeError, match="labels must be int64 or int32; got torch.float32"):
        linear_cross_entropy(h, w, y.float())
    with pytest.raises(TypeError, match="share one floating dtype; got torch.float32 and torch.bfloat16"):
        linear_cross_entropy(h, w.bfloat16(), y)
    with pytest.raises(ValueError, match="reduction must be 'mean' or 'sum'; got 'none'"):
        linear_cross_entropy(h, w, y, reduction="none")
    with pytest.raises(ValueError, match=r"gradients must be one of \('forward', 'backward'\); got 'later'"):
        linear_cross_entropy(h, w, y, gradients="later")
