"""zoo.nn.norm: fused dropout + residual + LayerNorm/RMSNorm against float64 references."""

import pytest
import torch

from trainers.memory.saved_activations import SavedActivations
from zoo.nn.dropout import dropout, keep_mask
from zoo.nn.norm import Norm, dropout_add, dropout_add_norm, layer_norm, rms_norm
from zoo.parity import relative_error

WIDTH = 48


def reference(x, residual, weight, bias, kind, eps):
    s = x if residual is None else x + residual
    if kind == "layer":
        y = torch.nn.functional.layer_norm(s, (s.shape[-1],), weight, bias, eps)
    else:
        y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * weight
    return y, s


def inputs(dtype, kind, seed):
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape, scale=1.0: (torch.randn(*shape, generator=g, dtype=torch.float64) * scale)  # noqa: E731
    x, r = make(3, 7, WIDTH, scale=3.0) + 1.0, make(3, 7, WIDTH)
    w = make(WIDTH).abs() + 0.5
    b = make(WIDTH) if kind == "layer" else None
    leaves = [t.to(dtype).requires_grad_() for t in (x, r, w)] + ([b.to(dtype).requires_grad_()] if b is not None else [])
    return [x, r, w, b], leaves


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("prenorm", [False, True])
@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)])
def test_dropout_add_norm_matches_float64(kind, prenorm, dtype, tolerance):
    (x, r, w, b), leaves = inputs(dtype, kind, seed=hash((kind, prenorm)) % 1000)
    ours = dropout_add_norm(leaves[0], leaves[1], leaves[2], leaves[3] if b is not None else None, norm=kind,
                            prenorm=prenorm, eps=1e-5)
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    y, s = reference(ref_leaves[0], ref_leaves[1], ref_leaves[2], ref_leaves[3] if b is not None else None, kind, 1e-5)
    g = torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    gs = torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    if prenorm:
        assert relative_error(ours[1], s) < tolerance
        torch.autograd.backward(ours, (g.to(dtype), gs.to(dtype)))
        torch.autograd.backward((y, s), (g, gs))
        ours = ours[0]
    else:
        ours.backward(g.to(dtype))
        y.backward(g)
    assert ours.dtype == dtype
    assert relative_error(ours, y) < tolerance
    for mine, theirs in zip(leaves, ref_leaves):
        assert relative_error(mine.grad, theirs.grad) < tolerance * 5


def test_layer_norm_and_rms_norm_without_affine_or_residual():
    x = torch.randn(5, WIDTH, dtype=torch.float64, requires_grad=True)
    y = layer_norm(x.float(), None)
    assert relative_error(y, torch.nn.functional.layer_norm(x, (WIDTH,))) < 1e-6
    w = torch.rand(WIDTH) + 0.5
    y = rms_norm(x.float(), w, eps=1e-6)
    assert relative_error(y, reference(x, None, w.double(), None, "rms", 1e-6)[0]) < 1e-6


def test_norm_saves_only_its_output_and_rstd():
    x = torch.randn(64, WIDTH, requires_grad=True)
    residual = torch.randn(64, WIDTH, requires_grad=True)
    norm = Norm(WIDTH)
    with SavedActivations(exclude=norm.parameters()) as saved:
        y, s = norm(x, residual, p=0.3, prenorm=True)
    assert saved.count == 2
    assert saved.bytes == y.numel() * 4 + 64 * 4  # y (float32) + one float32 rstd per row


def test_dropout_mask_is_reproducible_and_unbiased():
    x = torch.ones(200_000, requires_grad=True)
    torch.manual_seed(3)
    first = dropout(x, 0.25)
    torch.manual_seed(3)
    second = dropout(x, 0.25)
    assert torch.equal(first, second)
    assert abs((first == 0).float().mean().item() - 0.25) < 0.005
    assert abs(first.mean().item() - 1.0) < 0.01  # inverted dropout keeps the expectation
    first.backward(torch.full_like(x, 2.0))
    assert torch.equal(x.grad, first * 2.0)  # the regenerated mask equals the forward's
    assert not torch.equal(keep_mask((1000,), 0.5, 1, x.device), keep_mask((1000,), 0.5, 2, x.device))


def test_dropout_add_regenerates_the_forward_mask():
    x = torch.randn(4, 9, WIDTH, requires_grad=True)
    residual = torch.randn(4, 9, WIDTH, requires_grad=True)
    s = dropout_add(x, residual, p=0.4)
    kept = (s - residual).detach() != 0
    s.backward(torch.ones_like(s))
    assert torch.equal(x.grad != 0, kept)
    assert torch.allclose(x.grad[kept], torch.full_like(x.grad[kept], 1 / 0.6))
    assert torch.equal(residual.grad, torch.ones_like(residual))


def test_bad_input_is_named():
    x = torch.randn(2, WIDTH)
    with pytest.raises(ValueError, match="weight must have shape"):
        dropout_add_norm(x, None, torch.ones(WIDTH + 1))
    with pytest.raises(ValueError, match="residual must have"):
        dropout_add_norm(x, torch.randn(3, WIDTH), torch.ones(WIDTH))
    with pytest.raises(ValueError, match="norm must be one of"):
        dropout_add_norm(x, None, torch.ones(WIDTH), norm="batch")
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\)"):
        dropout_add(x, x, p=1.0)
    with pytest.raises(TypeError, match="floating"):
        layer_norm(torch.ones(2, WIDTH, dtype=torch.long), None)
