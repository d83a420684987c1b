"""The Triton kernels of zoo.nn against float64 references: on a GPU when present, otherwise in the
Triton interpreter on CPU at small shapes (tests/conftest.py sets TRITON_INTERPRET=1)."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from zoo.torch_compat import FakeTensorMode

from trainers.memory.saved_activations import SavedActivations
from test_fused_activation import REFERENCE
from zoo.nn import backend
from zoo.nn.activation import bias_act_dropout
from zoo.nn.cross_entropy import linear_cross_entropy
from zoo.nn.dropout import dropout
from zoo.nn.mlp import fused_mlp
from zoo.nn.norm import dropout_add, dropout_add_norm
from zoo.parity import relative_error

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def leaves(*tensors):
    return [t.detach().to(DEVICE).requires_grad_() for t in tensors]


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("prenorm", [False, True])
def test_norm_kernel_matches_float64(kind, prenorm):
    g = torch.Generator().manual_seed(1)
    x, r = torch.randn(2, 5, 40, generator=g, dtype=torch.float64) * 2 + 1, torch.randn(2, 5, 40, generator=g, dtype=torch.float64)
    w, b = torch.rand(40, generator=g, dtype=torch.float64) + 0.5, torch.randn(40, generator=g, dtype=torch.float64)
    b = b if kind == "layer" else None
    ours = leaves(*(t.float() for t in (x, r, w) + ((b,) if b is not None else ())))
    refs = [t.detach().requires_grad_() for t in (x, r, w) + ((b,) if b is not None else ())]
    out = dropout_add_norm(*ours[:3], ours[3] if b is not None else None, norm=kind, prenorm=prenorm, backend="triton")
    s = refs[0] + refs[1]
    if kind == "layer":
        y = F.layer_norm(s, (40,), refs[2], refs[3], 1e-5)
    else:
        y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * refs[2]
    grad = torch.randn(y.shape, generator=g, dtype=torch.float64)
    if prenorm:
        assert relative_error(out[1].cpu(), s) < 1e-6
        torch.autograd.backward(out, (grad.float().to(DEVICE), grad.float().to(DEVICE)))
        torch.autograd.backward((y, s), (grad, grad))
        out = out[0]
    else:
        out.backward(grad.float().to(DEVICE))
        y.backward(grad)
    assert relative_error(out.cpu(), y) < 1e-6
    for mine, theirs in zip(ours, refs):
        assert relative_error(mine.grad.cpu(), theirs.grad) < 1e-5


def test_norm_kernel_dropout_mask_is_regenerated():
    x, r = leaves(torch.randn(6, 32), torch.randn(6, 32))
    torch.manual_seed(0)
    s = dropout_add(x, r, p=0.5, backend="triton")
    kept = (s - r).detach() != 0
    assert 0.3 < kept.float().mean().item() < 0.7
    s.backward(torch.ones_like(s))
    assert torch.equal(x.grad != 0, kept)
    torch.manual_seed(0)
    assert torch.equal(dropout_add(x, r, p=0.5, backend="triton"), s)


@pytest.mark.parametrize("activation", sorted(REFERENCE))
@pytest.mark.parametrize("save", ["input", "derivative"])
def test_bias_act_kernel_matches_float64(activation, save):
    g = torch.Generator().manual_seed(2)
    # 2,400 elements: three 1024-wide programs, whose starts fall mid-row (1024 is not a multiple of 40).
    x64, b64 = torch.randn(3, 20, 40, generator=g, dtype=torch.float64), torch.randn(40, generator=g, dtype=torch.float64)
    x, b = leaves(x64.float(), b64.float())
    out = bias_act_dropout(x, b, activation, save=save, backend="triton")
    x64.requires_grad_(), b64.requires_grad_()
    expected = REFERENCE[activation](x64 + b64)
    grad = torch.randn(expected.shape, generator=g, dtype=torch.float64)
    out.backward(grad.float().to(DEVICE))
    expected.backward(grad)
    assert relative_error(out.cpu(), expected) < 1e-6
    assert relative_error(x.grad.cpu(), x64.grad) < 1e-5
    assert relative_error(b.grad.cpu(), b64.grad) < 1e-5


def test_dropout_and_mlp_kernels():
    (x,) = leaves(torch.ones(5000))
    torch.manual_seed(5)
    y = dropout(x, 0.3, backend="triton")
    assert abs((y == 0).float().mean().item() - 0.3) < 0.03
    y.backward(torch.ones_like(y))
    assert torch.equal(x.grad, y.detach())
    g = torch.Generator().manual_seed(3)
    tensors = [torch.randn(s, generator=g, dtype=torch.float64) * 0.5 for s in ((2, 6, 16), (32, 16), (32,), (16, 32), (16,))]
    ours = leaves(*(t.float() for t in tensors))
    out = fused_mlp(*ours, activation="gelu_tanh", backend="triton")
    refs = [t.requires_grad_() for t in tensors]
    expected = F.linear(REFERENCE["gelu_tanh"](F.linear(refs[0], refs[1], refs[2])), refs[3], refs[4])
    out.sum().backward()
    expected.sum().backward()
    assert relative_error(out.cpu(), expected) < 1e-6
    for mine, theirs in zip(ours, refs):
        assert relative_error(mine.grad.cpu(), theirs.grad) < 1e-5


def test_triton_backend_needs_a_gpu_or_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    if DEVICE == "cpu":
        with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
            dropout(torch.ones(3), 0.5, backend="triton")
    with pytest.raises(ValueError, match="backend must be one of"):
        dropout(torch.ones(3), 0.5, backend="cuda")


def test_auto_backend_takes_the_pytorch_path_under_the_estimators_fake_tensors(monkeypatch):
    monkeypatch.setenv("MEMZOO_KERNELS", "auto")
    monkeypatch.setattr(backend, "triton_available", lambda: True)
    # Where torch has no CUDA, an object that says it is on a GPU stands in for a CUDA tensor.
    on_gpu = torch.ones(3, device="cuda") if DEVICE == "cuda" else SimpleNamespace(is_cuda=True)
    assert backend.resolve_backend(None, on_gpu) == "triton"
    with FakeTensorMode():
        assert backend.resolve_backend(None, on_gpu) == "torch"  # a Triton kernel cannot read fake tensors


@pytest.mark.parametrize("reduction,label_smoothing,gradients", [("mean", 0.0, "forward"), ("sum", 0.1, "backward")])
def test_cross_entropy_kernel_matches_float64(reduction, label_smoothing, gradients):
    g = torch.Generator().manual_seed(4)
    hidden64 = torch.randn(37, 16, generator=g, dtype=torch.float64)
    weight64 = torch.randn(1500, 16, generator=g, dtype=torch.float64) * 0.3  # > one 1024-wide block
    labels = torch.randint(0, 1500, (37,), generator=g)
    labels[[3, 20]] = -100
    hidden, weight = leaves(hidden64.float(), weight64.float())
    loss = linear_cross_entropy(hidden, weight, labels.to(DEVICE), reduction=reduction,
                                label_smoothing=label_smoothing, chunk_size=10, backend="triton", gradients=gradients)
    hidden64.requires_grad_(), weight64.requires_grad_()
    expected = F.cross_entropy(hidden64 @ weight64.T, labels, reduction=reduction, label_smoothing=label_smoothing)
    loss.backward()
    expected.backward()
    assert relative_error(loss.cpu(), expected) < 1e-6
    assert relative_error(hidden.grad.cpu(), hidden64.grad) < 1e-5
    assert relative_error(weight.grad.cpu(), weight64.grad) < 1e-5


def test_bias_act_kernel_writes_a_bfloat16_derivative():
    x64 = torch.randn(4000, generator=torch.Generator().manual_seed(6), dtype=torch.float64) * 3
    (x,) = leaves(x64.float())
    with SavedActivations() as saved:
        out = bias_act_dropout(x, None, "gelu", save="derivative", derivative_dtype=torch.bfloat16, backend="triton")
    assert saved.bytes == x.numel() * 2
    out.sum().backward()
    x64.requires_grad_()
    REFERENCE["gelu"](x64).sum().backward()
    assert 1e-4 < relative_error(x.grad.cpu(), x64.grad) < 2 ** -8
