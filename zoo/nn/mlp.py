"""The transformer feed-forward layer, fc2(dropout(act(fc1(x)))), as one autograd function that
keeps only its input x (which the preceding LayerNorm keeps anyway) and the pre-activation z.

Plain PyTorch keeps z, act(z) (the input of fc2) and a dropout mask: 2 x (N, F) + mask. Here
act(z) and the mask are recomputed in backward from z and a seed, so the layer's own saved bytes
are one (N, F) tensor.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from zoo.nn.activation import Activation, act_dropout_backward, act_dropout_forward, check_activation
from zoo.nn.backend import Backend, resolve_backend
from zoo.nn.dropout import check_probability, draw_seed


class _FusedMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, activation, p, backend):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        dtype = x.dtype
        w1c, w2c = w1.to(dtype), w2.to(dtype)
        z = F.linear(x2, w1c, None if b1 is None else b1.to(dtype))
        seed = draw_seed(p)
        hidden = act_dropout_forward(z, activation, p, seed, backend)
        out = F.linear(hidden, w2c, None if b2 is None else b2.to(dtype))
        ctx.save_for_backward(x2, z, w1, w2)
        ctx.config = (activation, p, seed, backend, b1 is not None, b2 is not None)
        ctx.input_shape = shape
        return out.reshape(*shape[:-1], w2.shape[0])

    @staticmethod
    def backward(ctx, grad):
        x2, z, w1, w2 = ctx.saved_tensors
        activation, p, seed, backend, has_b1, has_b2 = ctx.config
        needs = ctx.needs_input_grad
        dtype = x2.dtype
        grad = grad.reshape(-1, grad.shape[-1]).to(dtype)
        grad_w2 = grad_b2 = grad_w1 = grad_b1 = grad_x = None
        if needs[3]:
            grad_w2 = (grad.t() @ act_dropout_forward(z, activation, p, seed, backend)).to(w2.dtype)
        if has_b2 and needs[4]:
            grad_b2 = grad.sum(0)
        grad_z = act_dropout_backward(grad @ w2.to(dtype), z, activation, p, seed, backend, inplace=True)
        if has_b1 and needs[2]:
            grad_b1 = grad_z.sum(0)
        if needs[1]:
            grad_w1 = (grad_z.t() @ x2).to(w1.dtype)
        if needs[0]:
            grad_x = (grad_z @ w1.to(dtype)).reshape(ctx.input_shape)
        return grad_x, grad_w1, grad_b1, grad_w2, grad_b2, None, None, None


SplitWeightMLP = Callable[..., torch.Tensor]
"""A fused feed-forward for weights split over ranks: called as `fused_mlp` is."""
_split_weight_mlps: dict[type, SplitWeightMLP] = {}


def register_split_weight_mlp(weight_type: type, mlp: SplitWeightMLP) -> None:
    """Route `fused_mlp` calls whose w1 is a `weight_type` (a tensor subclass split over ranks) to
    `mlp`. The training core installs its tensor-parallel feed-forward this way
    (`trainers.parallel.styles.sharded_fused_mlp`), so that zoo.nn holds no distributed code."""
    _split_weight_mlps[weight_type] = mlp


def fused_mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None, w2: torch.Tensor, b2: torch.Tensor | None,
              activation: Activation = "gelu", p: float = 0.0, *, training: bool = True,
              backend: Backend | None = None) -> torch.Tensor:
    """fc2(dropout_p(act(fc1(x)))): x (..., H); w1 (F, H); b1 (F,); w2 (H2, F); b2 (H2,) -> (..., H2).

    Saves x and z = fc1(x) (N, F) only; dropout here is the (rarely used) one after the
    activation. Computes in x's dtype. A w1 of a type registered by `register_split_weight_mlp` (a
    DTensor split over a tensor-parallel group) takes that implementation."""
    check_activation(activation)
    check_probability("p", p)
    if w1.ndim != 2 or w2.ndim != 2 or w1.shape[1] != x.shape[-1] or w2.shape[1] != w1.shape[0]:
        raise ValueError(f"expected w1 (F, H={x.shape[-1]}) and w2 (H2, F); got {tuple(w1.shape)} and {tuple(w2.shape)}")
    if b1 is not None and b1.shape != w1.shape[:1]:
        raise ValueError(f"b1 must have shape ({w1.shape[0]},); got {tuple(b1.shape)}")
    if b2 is not None and b2.shape != w2.shape[:1]:
        raise ValueError(f"b2 must have shape ({w2.shape[0]},); got {tuple(b2.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating tensor; got {x.dtype}")
    for weight_type, split_mlp in _split_weight_mlps.items():
        if isinstance(w1, weight_type):
            return split_mlp(x, w1, b1, w2, b2, activation, p, training=training, backend=backend)
    return _FusedMLP.apply(x, w1, b1, w2, b2, activation, p if training else 0.0, resolve_backend(backend, x))


class FusedMLP(nn.Module):
    """Feed-forward layer `fc2(act(fc1(x)))` (state-dict names fc1.*, fc2.*) on `fused_mlp`.

    fc1 is the column-parallel linear and fc2 the row-parallel one for tensor parallelism."""

    def __init__(self, width: int, hidden: int, activation: Activation = "gelu", bias: bool = True,
                 dropout: float = 0.0) -> None:
        super().__init__()
        check_activation(activation)
        check_probability("dropout", dropout)
        self.activation, self.dropout = activation, dropout
        self.fc1 = nn.Linear(width, hidden, bias=bias)
        self.fc2 = nn.Linear(hidden, width, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., width) -> (..., width)."""
        return fused_mlp(x, self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias, self.activation,
                         self.dropout, training=self.training)

    def extra_repr(self) -> str:
        return f"activation={self.activation}, dropout={self.dropout}"
