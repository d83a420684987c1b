"""Simple and pruned RNN-T: the simple loss is the full loss of an additive joiner, pruning keeps a path
through the windows, and the pruned loss is exact on its windows."""

import pytest
import torch

from asr.losses import prune_decoder, prune_ranges, pruned_rnnt_loss, pruned_transducer_losses, rnnt_loss
from asr.losses import simple_rnnt_loss
from joiners import TanhJoiner, transducer_batch
from reference import brute_force_nll
from zoo.parity import relative_error


def additive(seed, frames, symbols, batch, vocab=6):
    g = torch.Generator().manual_seed(seed)
    am = torch.randn(batch, frames, vocab, generator=g, dtype=torch.float64) * 2
    lm = torch.randn(batch, symbols + 1, vocab, generator=g, dtype=torch.float64) * 2
    return am, lm, torch.randint(1, vocab, (batch, symbols), generator=g)


@pytest.mark.parametrize("topology", ["regular", "modified"])
def test_simple_loss_is_the_full_loss_of_an_additive_joiner(topology):
    am, lm, targets = additive(0, 6, 4, 3)
    logit_lengths, target_lengths = torch.tensor([6, 4, 5]), torch.tensor([4, 3, 0])
    simple_inputs = [am.clone().requires_grad_(), lm.clone().requires_grad_()]
    full_inputs = [am.clone().requires_grad_(), lm.clone().requires_grad_()]
    simple = simple_rnnt_loss(*simple_inputs, targets, logit_lengths, target_lengths, reduction="none",
                              topology=topology, delay_penalty=0.2)
    full = rnnt_loss(full_inputs[0][:, :, None] + full_inputs[1][:, None], targets, logit_lengths, target_lengths,
                     reduction="none", topology=topology, delay_penalty=0.2)
    assert relative_error(simple.detach(), full.detach()) < 1e-14
    simple.sum().backward()
    full.sum().backward()
    for ours, theirs in zip(simple_inputs, full_inputs):
        assert relative_error(ours.grad, theirs.grad) < 1e-13


def test_simple_loss_passes_gradcheck():
    am, lm, targets = additive(1, 4, 2, 2)
    am.requires_grad_(), lm.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda a, l: simple_rnnt_loss(a, l, targets, torch.tensor([4, 3]), torch.tensor([2, 1]), reduction="none"),
        (am, lm))


@pytest.mark.parametrize("topology", ["regular", "modified"])
@pytest.mark.parametrize("s_range", [2, 3, 4])
def test_windows_always_hold_a_path_and_the_pruned_loss_is_exact_on_them(topology, s_range):
    frames, symbols = 6, 5
    am, lm, targets = additive(2 + s_range, frames, symbols, 4)
    logit_lengths, target_lengths = torch.tensor([6, 3, 5, 2]), torch.tensor([5, 5, 2, 1])
    if topology == "modified":
        target_lengths = torch.minimum(target_lengths, logit_lengths)
    _, posterior = simple_rnnt_loss(am, lm, targets, logit_lengths, target_lengths, topology=topology,
                                    return_occupancies=True)
    if (target_lengths > logit_lengths * (s_range - 1 if topology == "regular" else s_range)).any():
        with pytest.raises(ValueError, match=f"s_range={s_range} is too small"):
            prune_ranges(posterior, logit_lengths, target_lengths, s_range, topology)
        return
    starts = prune_ranges(posterior, logit_lengths, target_lengths, s_range, topology)
    step = s_range - 1 if topology == "regular" else s_range
    for b in range(4):
        t_b, u_b = int(logit_lengths[b]), int(target_lengths[b])
        s = starts[b, :t_b]
        assert s[0] == 0 and (s.diff() >= 0).all() and (s.diff() <= step).all()
        assert s[-1] + s_range - 1 >= (u_b if topology == "regular" else u_b - 1)
    logits = (am[:, :, None] + prune_decoder(lm, starts, s_range)).requires_grad_()
    pruned = pruned_rnnt_loss(logits, targets, starts, logit_lengths, target_lengths, reduction="none",
                              topology=topology)
    log_probs = (am[:, :, None] + lm[:, None]).log_softmax(-1)
    for b in range(4):
        t_b, u_b = int(logit_lengths[b]), int(target_lengths[b])
        expected = brute_force_nll(log_probs[b, :t_b, :u_b + 1], targets[b, :u_b].tolist(), 0, topology,
                                   allowed=lambda t, u: starts[b, t] <= u < starts[b, t] + s_range)
        assert abs(pruned[b].item() - expected.item()) < 1e-12 * abs(expected.item())
    full = rnnt_loss(am[:, :, None] + lm[:, None], targets, logit_lengths, target_lengths, reduction="none",
                     topology=topology)
    assert (pruned >= full - 1e-12).all()  # fewer paths: a lower likelihood


def test_pruned_with_the_whole_lattice_equals_the_full_loss():
    encoder_out, decoder_out, targets, logit_lengths, target_lengths = transducer_batch(3, [5, 4, 2], [3, 2, 3], 5, 3)
    joiner = TanhJoiner(8, 8, 16, 7).double()
    am, lm = torch.nn.Linear(8, 7).double(), torch.nn.Linear(8, 7).double()
    inputs = [encoder_out, decoder_out, *joiner.parameters()]
    simple, pruned = pruned_transducer_losses(am(encoder_out), lm(decoder_out), encoder_out, decoder_out, joiner,
                                              targets, logit_lengths, target_lengths, s_range=4)
    pruned_grads = torch.autograd.grad(pruned, inputs)
    full = rnnt_loss(joiner(encoder_out[:, :, None], decoder_out[:, None]), targets, logit_lengths, target_lengths)
    full_grads = torch.autograd.grad(full, inputs)
    assert relative_error(pruned, full) < 1e-14
    for ours, theirs in zip(pruned_grads, full_grads):
        assert relative_error(ours, theirs) < 1e-13
    assert simple.item() > 0


def test_pruned_bad_inputs():
    am, lm, targets = additive(4, 3, 5, 1)
    _, posterior = simple_rnnt_loss(am, lm, targets, torch.tensor([3]), torch.tensor([5]), return_occupancies=True)
    with pytest.raises(ValueError, match="U=5 symbols in T=3 frames, which needs s_range >= 3"):
        prune_ranges(posterior, torch.tensor([3]), torch.tensor([5]), 2)
    with pytest.raises(ValueError, match="s_range must be an int >= 2"):
        prune_ranges(posterior, torch.tensor([3]), torch.tensor([5]), 1)
    starts = prune_ranges(posterior, torch.tensor([3]), torch.tensor([5]), 3)
    logits = am[:, :, None] + prune_decoder(lm, starts, 3)
    with pytest.raises(ValueError, match="starts must be int64 of shape \\(1, 3\\)"):
        pruned_rnnt_loss(logits, targets, starts[:, :2], torch.tensor([3]), torch.tensor([5]))


def test_simple_loss_names_its_inputs():
    am, lm, targets = additive(5, 3, 2, 1)
    with pytest.raises(TypeError, match="lm must be a floating-point tensor"):
        simple_rnnt_loss(am, lm.long(), targets, torch.tensor([3]), torch.tensor([2]))
    with pytest.raises(ValueError, match="lm must be on am's device"):
        simple_rnnt_loss(am, lm.to("meta"), targets, torch.tensor([3]), torch.tensor([2]))
