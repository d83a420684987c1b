"""Sample-wise loss: the same loss and gradients as the batched loss, one group's joiner output alive."""

import pytest
import torch

from asr.losses import Pruning, pruned_transducer_losses, rnnt_loss, samplewise_rnnt_loss
from asr.losses.samplewise import plan_groups
from joiners import TanhJoiner, transducer_batch
from zoo.parity import relative_error

LOGIT_LENGTHS, TARGET_LENGTHS = [7, 5, 3, 7, 2, 6], [4, 2, 4, 0, 1, 3]


class RecordingJoiner(TanhJoiner):
    """Remembers the largest output it produced while gradients were on (the forward of a group)."""

    largest = 0

    def forward(self, enc, dec):
        logits = super().forward(enc, dec)
        if torch.is_grad_enabled():
            self.largest = max(self.largest, logits.numel())
        return logits


def setup(seed=0):
    torch.manual_seed(seed)
    joiner = RecordingJoiner(8, 8, 16, 7).double()
    return joiner, *transducer_batch(seed, LOGIT_LENGTHS, TARGET_LENGTHS, 7, 4)


@pytest.mark.parametrize("grouping", [dict(), dict(group_size=4), dict(memory_budget=30_000)])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_loss_and_gradients_equal_the_batched_loss(grouping, reduction):
    joiner, encoder_out, decoder_out, targets, logit_lengths, target_lengths = setup()
    inputs = [encoder_out, decoder_out, *joiner.parameters()]
    batched = rnnt_loss(joiner(encoder_out[:, :, None], decoder_out[:, None]), targets, logit_lengths,
                        target_lengths, reduction=reduction, delay_penalty=0.1)
    expected = torch.autograd.grad(batched * 0.7, inputs)
    joiner.largest = 0
    loss = samplewise_rnnt_loss(encoder_out, decoder_out, joiner, targets, logit_lengths, target_lengths,
                                reduction=reduction, delay_penalty=0.1, **grouping)
    got = torch.autograd.grad(loss * 0.7, inputs)
    assert relative_error(loss, batched) < 1e-14
    for ours, theirs in zip(got, expected):
        assert relative_error(ours, theirs) < 1e-13
    if not grouping:  # one sample at a time: at most the longest sample's (T_b, U_b + 1, V)
        assert joiner.largest == max(t * (u + 1) for t, u in zip(LOGIT_LENGTHS, TARGET_LENGTHS)) * 7


def test_gradients_accumulate_into_parameters_like_any_loss():
    joiner, encoder_out, decoder_out, targets, logit_lengths, target_lengths = setup(1)
    samplewise_rnnt_loss(encoder_out, decoder_out, joiner, targets, logit_lengths, target_lengths).backward()
    once = [p.grad.clone() for p in joiner.parameters()]
    samplewise_rnnt_loss(encoder_out, decoder_out, joiner, targets, logit_lengths, target_lengths).backward()
    for first, twice in zip(once, joiner.parameters()):
        assert relative_error(twice.grad, 2 * first) < 1e-15


def test_samplewise_pruned_equals_batched_pruned():
    joiner, encoder_out, decoder_out, targets, logit_lengths, target_lengths = setup(2)
    am, lm = torch.nn.Linear(8, 7).double(), torch.nn.Linear(8, 7).double()
    inputs = [encoder_out, decoder_out, *joiner.parameters(), *am.parameters(), *lm.parameters()]
    simple, pruned = pruned_transducer_losses(am(encoder_out), lm(decoder_out), encoder_out, decoder_out, joiner,
                                              targets, logit_lengths, target_lengths, s_range=3)
    expected = torch.autograd.grad(0.25 * simple + pruned, inputs)
    joiner.largest = 0
    loss, simple_part, pruned_part = samplewise_rnnt_loss(encoder_out, decoder_out, joiner, targets, logit_lengths,
                                                          target_lengths, pruning=Pruning(3, am, lm, 0.25),
                                                          group_size=2)
    got = torch.autograd.grad(loss, inputs)
    assert relative_error(simple_part, simple) < 1e-14 and relative_error(pruned_part, pruned) < 1e-14
    assert relative_error(loss, 0.25 * simple + pruned) < 1e-14
    for mine, theirs in zip(got, expected):
        assert relative_error(mine, theirs) < 1e-13
    assert joiner.largest <= 2 * 7 * 3 * 7  # two samples x T_g x s_range x V


def test_groups_follow_the_memory_budget():
    cells = torch.tensor([40, 10, 30, 20])
    frames, columns = torch.tensor([8, 5, 6, 5]), torch.tensor([5, 2, 5, 4])
    groups = plan_groups(cells, frames, columns, None, 300, bytes_per_cell=4)
    assert [g.tolist() for g in groups] == [[1, 3], [2], [0]]
    for group in groups:
        assert len(group) == 1 or len(group) * frames[group].max() * columns[group].max() * 4 <= 300
    assert [g.tolist() for g in plan_groups(cells, frames, columns, 3, None, 0)] == [[1, 3, 2], [0]]


def test_bad_arguments():
    joiner, encoder_out, decoder_out, targets, logit_lengths, target_lengths = setup(3)
    with pytest.raises(ValueError, match="reduction must be one of \\('mean', 'sum'\\)"):
        samplewise_rnnt_loss(encoder_out, decoder_out, joiner, targets, logit_lengths, target_lengths,
                             reduction="none")
    with pytest.raises(ValueError, match="group_size must be >= 1"):
        samplewise_rnnt_loss(encoder_out, decoder_out, joiner, targets, logit_lengths, target_lengths, group_size=0)
    with pytest.raises(ValueError, match="s_range=2 is too small"):
        samplewise_rnnt_loss(encoder_out, decoder_out, joiner, targets, logit_lengths, target_lengths,
                             pruning=Pruning(2, torch.nn.Linear(8, 7).double(), torch.nn.Linear(8, 7).double()))
    loss = samplewise_rnnt_loss(encoder_out, decoder_out, joiner, targets, logit_lengths, target_lengths)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward runs once"):
        loss.backward()


def test_runs_under_a_module_tracking_memory_tracker():
    from zoo.torch_compat import MemTracker
    from torch.nn.modules import module

    torch.manual_seed(0)
    joiner = TanhJoiner(8, 8, 16, 7).double()
    encoder_out, decoder_out, targets, logit_lengths, target_lengths = transducer_batch(3, [5, 4, 3], [2, 3, 1], 5, 3)
    hooks_before = len(module._global_forward_pre_hooks)
    tracker = MemTracker()
    tracker.track_external(joiner)
    with tracker:  # its module hooks would see the groups' backward inside the forward pass
        loss = samplewise_rnnt_loss(encoder_out, decoder_out, joiner, targets, logit_lengths, target_lengths,
                                    group_size=1)
        loss.backward()
        assert len(module._global_forward_pre_hooks) == hooks_before + 1  # the tracker's, restored
    expected = rnnt_loss(joiner(encoder_out[:, :, None], decoder_out[:, None]), targets, logit_lengths, target_lengths)
    assert relative_error(loss, expected) < 1e-12 and tracker.get_tracker_snapshot("peak")
