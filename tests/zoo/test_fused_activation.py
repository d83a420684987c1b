"""zoo.nn.activation and zoo.nn.mlp against float64 references."""

import math

import pytest
import torch
import torch.nn.functional as F

from trainers.memory.saved_activations import SavedActivations
from zoo.nn.activation import bias_act_dropout
from zoo.nn.mlp import FusedMLP, fused_mlp
from zoo.parity import relative_error

REFERENCE = {
    "gelu": lambda z: 0.5 * z * (1 + torch.erf(z / math.sqrt(2))),
    "gelu_tanh": lambda z: 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3))),
    "silu": lambda z: z * torch.sigmoid(z),
    "relu": torch.relu,
}


@pytest.mark.parametrize("activation", sorted(REFERENCE))
@pytest.mark.parametrize("save", ["input", "derivative"])
def test_bias_act_matches_float64(activation, save):
    g = torch.Generator().manual_seed(len(activation))
    x64 = torch.randn(6, 5, 40, dtype=torch.float64, generator=g).requires_grad_()
    b64 = torch.randn(40, dtype=torch.float64, generator=g).requires_grad_()
    x, b = (t.detach().float().requires_grad_() for t in (x64, b64))
    out = bias_act_dropout(x, b, activation, save=save)
    expected = REFERENCE[activation](x64 + b64)
    grad = torch.randn(expected.shape, dtype=torch.float64, generator=g)
    out.backward(grad.float())
    expected.backward(grad)
    assert relative_error(out, expected) < 1e-6
    assert relative_error(x.grad, x64.grad) < 1e-6
    assert relative_error(b.grad, b64.grad) < 1e-6


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "silu"])
def test_bfloat16_derivative_error_is_bfloat16_rounding(activation):
    """The derivative stored in bfloat16 (half the bytes of a float32 input) costs one bf16 rounding."""
    x64 = torch.randn(20_000, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 3
    x = x64.float().requires_grad_()
    bias_act_dropout(x, None, activation, save="derivative", derivative_dtype=torch.bfloat16).sum().backward()
    x64.requires_grad_()
    REFERENCE[activation](x64).sum().backward()
    error = relative_error(x.grad, x64.grad)
    assert 1e-4 < error < 2 ** -8  # visibly rounded, within bf16's unit roundoff


def test_derivative_mode_saves_half_the_bytes_in_bfloat16():
    x = torch.randn(128, 64, requires_grad=True)
    for save, dtype, expected in (("input", None, x.numel() * 4), ("derivative", torch.bfloat16, x.numel() * 2)):
        with SavedActivations() as saved:
            bias_act_dropout(x, None, "gelu", 0.1, save=save, derivative_dtype=dtype)
        assert saved.bytes == expected


def test_activation_dropout_is_reproducible():
    x = torch.randn(4, 100, requires_grad=True)
    torch.manual_seed(9)
    a = bias_act_dropout(x, None, "relu", 0.5)
    torch.manual_seed(9)
    b = bias_act_dropout(x, None, "relu", 0.5)
    assert torch.equal(a, b)
    a.backward(torch.ones_like(a))
    assert torch.equal(x.grad, (a > 0).float() * 2.0)


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "silu", "relu"])
def test_fused_mlp_matches_float64_and_saves_input_and_preactivation(activation):
    torch.manual_seed(0)
    mlp = FusedMLP(32, 96, activation)
    x = torch.randn(3, 11, 32, requires_grad=True)
    with SavedActivations(exclude=mlp.parameters()) as saved:
        out = mlp(x)
    assert saved.count == 2 and saved.bytes == (32 + 96) * 33 * 4  # x and fc1(x)
    grad = torch.randn_like(out)
    out.backward(grad)
    mlp64 = [p.detach().double().requires_grad_() for p in (mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight, mlp.fc2.bias)]
    x64 = x.detach().double().requires_grad_()
    expected = F.linear(REFERENCE[activation](F.linear(x64, mlp64[0], mlp64[1])), mlp64[2], mlp64[3])
    expected.backward(grad.double())
    assert relative_error(out, expected) < 1e-6
    assert relative_error(x.grad, x64.grad) < 1e-6
    for p, p64 in zip((mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight, mlp.fc2.bias), mlp64):
        assert relative_error(p.grad, p64.grad) < 1e-6


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="activation must be one of"):
        bias_act_dropout(torch.randn(3), None, "tanh")
    with pytest.raises(ValueError, match="bias must have shape"):
        bias_act_dropout(torch.randn(2, 3), torch.randn(4))
    with pytest.raises(ValueError, match="save must be"):
        bias_act_dropout(torch.randn(3), save="output")
    with pytest.raises(ValueError, match="expected w1"):
        fused_mlp(torch.randn(2, 8), torch.randn(16, 7), None, torch.randn(8, 16), None)
