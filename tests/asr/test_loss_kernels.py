"""The Triton kernels of the transducer losses against the float64 brute force: on a GPU when present,
otherwise in the Triton interpreter on CPU (tests/conftest.py sets TRITON_INTERPRET=1)."""

import warnings

import pytest
import torch

from asr.losses import prune_decoder, prune_ranges, pruned_rnnt_loss, rnnt_loss, simple_rnnt_loss
from asr.losses.log_softmax_gradient import row_logsumexp
from test_rnnt_loss import batch, reference_losses
from zoo.parity import relative_error

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def quiet_interpreter():
    # The interpreter evaluates log(0) = -inf with numpy, which warns; -inf is the intended value.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "divide by zero", RuntimeWarning)
        yield


@pytest.mark.parametrize("topology", ["regular", "modified"])
@pytest.mark.parametrize("fused", [True, False])
def test_kernels_match_float64_brute_force(topology, fused):
    logits, targets, logit_lengths, target_lengths = batch(20, 5, 3, 37, [5, 1, 4], [3, 0, 2], -1)
    inputs = logits if fused else logits.log_softmax(-1)
    reference_inputs = inputs.clone().requires_grad_()
    expected = reference_losses(reference_inputs, targets, logit_lengths, target_lengths, -1, topology,
                                delay_penalty=0.1, log_softmax=fused)
    ours = inputs.float().to(DEVICE).requires_grad_()
    loss = rnnt_loss(ours, targets.to(DEVICE), logit_lengths.to(DEVICE), target_lengths.to(DEVICE), blank=-1,
                     reduction="none", fused_log_softmax=fused, topology=topology, delay_penalty=0.1,
                     backend="triton")
    weights = torch.tensor([1.0, 0.5, 2.0], dtype=torch.float64)
    (loss.cpu() * weights).sum().backward()
    (expected * weights).sum().backward()
    assert relative_error(loss.cpu(), expected.detach()) < 1e-6
    assert relative_error(ours.grad.cpu(), reference_inputs.grad) < 1e-5


def test_kernels_equal_the_torch_path_with_clamp_and_in_place_gradient():
    logits, targets, logit_lengths, target_lengths = batch(21, 4, 5, 300, [4, 3], [5, 2], 0, dtype=torch.float32)
    results = []
    for backend in ("torch", "triton"):
        x = logits.clone().to(DEVICE).requires_grad_()
        loss = rnnt_loss(x, targets.to(DEVICE), logit_lengths.to(DEVICE), target_lengths.to(DEVICE), clamp=0.01,
                         gradient_in_logits=True, backend=backend)
        loss.backward()
        results.append((loss.cpu(), x.grad.cpu()))
    assert relative_error(results[1][0], results[0][0]) < 1e-6
    assert relative_error(results[1][1], results[0][1]) < 1e-5
    assert results[1][1].abs().max() <= 0.01


def test_row_logsumexp_kernel_in_blocks():
    x = torch.randn(6, 5000, dtype=torch.float32) * 10
    x[2] = float("-inf")
    x[3, :4999] = float("-inf")
    got = row_logsumexp(x.to(DEVICE), backend="triton").cpu()
    expected = torch.logsumexp(x.double(), -1)
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    finite = torch.isfinite(expected)
    assert relative_error(got[finite], expected[finite]) < 1e-7


def test_pruned_loss_on_the_kernels():
    g = torch.Generator().manual_seed(22)
    am, lm = torch.randn(2, 6, 9, generator=g, dtype=torch.float64), torch.randn(2, 5, 9, generator=g, dtype=torch.float64)
    targets, logit_lengths, target_lengths = torch.randint(1, 9, (2, 4), generator=g), torch.tensor([6, 4]), torch.tensor([4, 3])
    _, posterior = simple_rnnt_loss(am, lm, targets, logit_lengths, target_lengths, return_occupancies=True)
    starts = prune_ranges(posterior, logit_lengths, target_lengths, 3)
    logits = am[:, :, None] + prune_decoder(lm, starts, 3)
    expected = pruned_rnnt_loss(logits, targets, starts, logit_lengths, target_lengths, reduction="none")
    simple_kernel = simple_rnnt_loss(am.float().to(DEVICE), lm.float().to(DEVICE), targets.to(DEVICE),
                                     logit_lengths.to(DEVICE), target_lengths.to(DEVICE), reduction="none",
                                     backend="triton")
    pruned = pruned_rnnt_loss(logits.float().to(DEVICE), targets.to(DEVICE), starts.to(DEVICE),
                              logit_lengths.to(DEVICE), target_lengths.to(DEVICE), reduction="none", backend="triton")
    assert relative_error(pruned.cpu(), expected) < 1e-6
    assert relative_error(simple_kernel.cpu(), simple_rnnt_loss(am, lm, targets, logit_lengths, target_lengths,
                                                                reduction="none")) < 1e-6
