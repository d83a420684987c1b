"""Bias + activation + dropout in one autograd function that saves the least its backward needs.

    out = dropout(act(x + bias))

`save="input"` keeps the pre-activation z = x + bias (in x's dtype). `save="derivative"` keeps
act'(z) instead, computed during the forward pass by forward-mode AD (one `torch.func.jvp` with a
unit tangent: the "nested forward AD" idea), optionally in bfloat16 to halve it again; its error
against the float64 reference is measured in tests and BENCHMARKS.md. The dropout mask is never
kept: it is regenerated from a seed (see `zoo.nn.dropout`).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from zoo.nn.backend import Backend, resolve_backend
from zoo.nn.dropout import apply_dropout, check_probability, draw_seed

Activation = Literal["gelu", "gelu_tanh", "silu", "relu"]
ACTIVATIONS = ("gelu", "gelu_tanh", "silu", "relu")
SaveMode = Literal["input", "derivative"]


def check_activation(activation: str) -> None:
    """Raise ValueError unless `activation` is one of ACTIVATIONS."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}; got {activation!r}")


def activate(z: torch.Tensor, activation: str) -> torch.Tensor:
    """act(z): "gelu" (erf), "gelu_tanh", "silu" or "relu"."""
    if activation == "gelu":
        return F.gelu(z)
    if activation == "gelu_tanh":
        return F.gelu(z, approximate="tanh")
    if activation == "silu":
        return F.silu(z)
    return F.relu(z)


def activate_backward(grad: torch.Tensor, z: torch.Tensor, activation: str, *, inplace: bool = False) -> torch.Tensor:
    """grad * act'(z) through the aten backward kernels; `inplace` writes the result into grad."""
    out = {"grad_input": grad} if inplace else {}
    if activation in ("gelu", "gelu_tanh"):
        kernel = torch.ops.aten.gelu_backward.grad_input if inplace else torch.ops.aten.gelu_backward
        return kernel(grad, z, approximate="tanh" if activation == "gelu_tanh" else "none", **out)
    if activation == "silu":
        kernel = torch.ops.aten.silu_backward.grad_input if inplace else torch.ops.aten.silu_backward
        return kernel(grad, z, **out)
    kernel = torch.ops.aten.threshold_backward.grad_input if inplace else torch.ops.aten.threshold_backward
    return kernel(grad, z, 0, **out)


def activate_with_derivative(z: torch.Tensor, activation: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(act(z), act'(z)) in one forward-mode AD pass (a jvp with tangent 1)."""
    return torch.func.jvp(lambda t: activate(t, activation), (z,), (torch.ones_like(z),))


def act_dropout_forward(z: torch.Tensor, activation: str, p: float, seed: int, backend: str) -> torch.Tensor:
    """dropout(act(z)) for z (N, F); the element-wise core shared with the fused MLP."""
    if backend == "triton":
        from zoo.nn.kernels.elementwise import bias_act_dropout_forward

        return bias_act_dropout_forward(z, None, activation, p, seed, None)[0]
    return apply_dropout(activate(z, activation), p, seed)


def act_dropout_backward(grad: torch.Tensor, z: torch.Tensor, activation: str, p: float, seed: int,
                         backend: str, *, inplace: bool = False) -> torch.Tensor:
    """d loss / d z from d loss / d dropout(act(z)), with the regenerated mask; `inplace`
    reuses grad's buffer (PyTorch path)."""
    if backend == "triton":
        from zoo.nn.kernels.elementwise import bias_act_dropout_backward

        return bias_act_dropout_backward(grad, z, activation, p, seed, "input")
    return activate_backward(apply_dropout(grad, p, seed, inplace=inplace), z, activation, inplace=inplace)


class _BiasActDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, activation, p, save, derivative_dtype, backend):
        seed = draw_seed(p)
        if backend == "triton":
            from zoo.nn.kernels.elementwise import bias_act_dropout_forward

            out, kept = bias_act_dropout_forward(x, bias, activation, p, seed, save,
                                                 derivative_dtype if save == "derivative" else None)
        else:
            z = x if bias is None else x + bias
            if save == "derivative":
                a, derivative = activate_with_derivative(z, activation)
                kept = derivative.to(derivative_dtype)
            else:
                a, kept = activate(z, activation), z
            out = apply_dropout(a, p, seed)
        ctx.save_for_backward(kept)
        ctx.config = (activation, p, seed, save, backend, x.dtype, bias is not None)
        return out

    @staticmethod
    def backward(ctx, grad):
        (kept,) = ctx.saved_tensors
        activation, p, seed, save, backend, dtype, has_bias = ctx.config
        if save == "derivative" and backend == "triton":
            from zoo.nn.kernels.elementwise import bias_act_dropout_backward

            grad_z = bias_act_dropout_backward(grad, kept, activation, p, seed, "derivative")
        elif save == "derivative":
            grad_z = apply_dropout(grad, p, seed) * kept.to(dtype)
        else:
            grad_z = act_dropout_backward(grad, kept, activation, p, seed, backend)
        grad_bias = grad_z.reshape(-1, grad_z.shape[-1]).sum(0) if has_bias and ctx.needs_input_grad[1] else None
        return grad_z, grad_bias, None, None, None, None, None


def bias_act_dropout(x: torch.Tensor, bias: torch.Tensor | None = None, activation: Activation = "gelu",
                     p: float = 0.0, *, training: bool = True, save: SaveMode = "input",
                     derivative_dtype: torch.dtype | None = None, backend: Backend | None = None) -> torch.Tensor:
    """dropout_p(act(x + bias)) for x (..., F) and bias (F,) or None; returns (..., F) in x's dtype.

    save="input" keeps z = x + bias for backward; save="derivative" keeps act'(z) computed in
    forward mode, stored in `derivative_dtype` (x's dtype by default; torch.bfloat16 halves it)."""
    check_activation(activation)
    check_probability("p", p)
    if save not in ("input", "derivative"):
        raise ValueError(f"save must be 'input' or 'derivative'; got {save!r}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating tensor; got {x.dtype}")
    if bias is not None and bias.shape != x.shape[-1:]:
        raise ValueError(f"bias must have shape ({x.shape[-1]},) (x's last dimension); got {tuple(bias.shape)}")
    return _BiasActDropout.apply(x, bias, activation, p if training else 0.0, save, derivative_dtype or x.dtype,
                                 resolve_backend(backend, x))
