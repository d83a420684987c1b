"""LayerNorm and RMSNorm, alone or fused with dropout and a residual add, saving only the output.

One autograd function covers every form:

    s = residual + dropout(x)        (residual and dropout optional)
    y = norm(s) * weight + bias      (LayerNorm or RMSNorm over the last dimension, fp32 statistics)

Backward recovers the normalised input from the output, x_hat = (y - bias) / weight, so it keeps
`y` (which the next linear layer saves anyway: the same storage) and one float32 `rstd` per row;
neither `s`, `x`, nor the dropout mask is kept. Consequence: weight entries must be non-zero
(they start at one; a zero entry makes x_hat infinite).

Post-LN blocks (BERT) call `dropout_add_norm(x, residual, ...)`; pre-LN blocks call it with
`prenorm=True` and receive `(y, s)`, the normalised value and the new residual stream.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from zoo.nn.backend import Backend, resolve_backend
from zoo.nn.dropout import apply_dropout, check_probability, draw_seed

NormKind = Literal["layer", "rms"]
NORM_KINDS = ("layer", "rms")


def statistics_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half-precision inputs, the input's own dtype for float32 and float64."""
    return torch.promote_types(dtype, torch.float32)


def _normalise(s: torch.Tensor, weight, bias, eps: float, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch path: (y (..., H) in s's dtype, rstd (N, 1) in the statistics dtype) for s (..., H)
    of N rows."""
    width = (s.shape[-1],)
    acc = statistics_dtype(s.dtype)
    sf = s.to(acc)
    w = None if weight is None else weight.to(acc)
    if kind == "layer":
        y, _, rstd = torch.native_layer_norm(sf, width, w, None if bias is None else bias.to(acc), eps)
    else:
        y, rstd = torch.ops.aten._fused_rms_norm(sf, list(width), w, eps)
        if bias is not None:
            y = y + bias.to(acc)
    return y.to(s.dtype), rstd.reshape(-1, 1)


def _normalise_backward(grad_y, y, rstd, weight, bias, kind: str, needs: tuple[bool, bool]):
    """PyTorch path: (d s (N, H), d weight, d bias) in rstd's dtype from the output y (..., H) of N rows.

    LayerNorm calls the aten backward kernel on x_hat with rstd = 1 and mean = 0, which makes it
    compute d s / rstd; one multiply by the true rstd finishes (RMSNorm likewise, in plain ops)."""
    width = [y.shape[-1]]
    acc = rstd.dtype
    x_hat = y.reshape(-1, width[0]).to(acc)
    w = None if weight is None else weight.to(acc)
    if w is not None:  # (y - bias) / w in one pass over y
        scale = w.reciprocal()
        x_hat = x_hat * scale if bias is None else torch.addcmul(-bias.to(acc) * scale, x_hat, scale)
    elif bias is not None:
        x_hat = x_hat - bias.to(acc)
    grad_y = grad_y.to(acc)
    if kind == "layer":
        grad_s, grad_w, grad_b = torch.ops.aten.native_layer_norm_backward(
            grad_y, x_hat, width, torch.zeros_like(rstd), torch.ones_like(rstd), w, None if bias is None else bias.to(acc),
            [True, needs[0] and w is not None, needs[1] and bias is not None])
    else:
        scaled = grad_y if w is None else grad_y * w
        grad_s = scaled - x_hat * (scaled * x_hat).mean(-1, keepdim=True)
        grad_w = (grad_y * x_hat).sum(0) if needs[0] and w is not None else None
        grad_b = grad_y.sum(0) if needs[1] and bias is not None else None
    return grad_s.mul_(rstd), grad_w, grad_b


class _DropoutAddNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, bias, p, eps, kind, return_sum, backend):
        # Outputs are made in x's shape, never as views of a flattened buffer: a module's output
        # that is a view trips FSDP2's hooks when the caller modifies it in place.
        seed = draw_seed(p)
        if backend == "triton":
            from zoo.nn.kernels.norm import norm_forward

            y, s, rstd = norm_forward(x, residual, weight, bias, p, seed, eps, kind, return_sum)
        else:
            s = apply_dropout(x, p, seed)
            if residual is not None:
                s = s + residual
            y, rstd = (None, None) if kind is None else _normalise(s, weight, bias, eps, kind)
        ctx.save_for_backward(y, rstd, weight, bias)
        ctx.config = (p, seed, kind, backend, x.dtype, None if residual is None else residual.dtype)
        ctx.shape = x.shape
        ctx.set_materialize_grads(False)
        if kind is None:
            return s
        return (y, s) if return_sum else y

    @staticmethod
    def backward(ctx, *grads):
        y, rstd, weight, bias = ctx.saved_tensors
        p, seed, kind, backend, x_dtype, residual_dtype = ctx.config
        shape = ctx.shape
        width = shape[-1]
        grad_y, grad_s = (None, grads[0]) if kind is None else (grads[0], grads[1] if len(grads) > 1 else None)
        grad_y = None if grad_y is None else grad_y.reshape(-1, width)
        grad_s = None if grad_s is None else grad_s.reshape(-1, width)
        needs = (ctx.needs_input_grad[2], ctx.needs_input_grad[3])
        if grad_y is None and grad_s is None:
            return (None,) * 9
        if backend == "triton":
            from zoo.nn.kernels.norm import norm_backward

            total, grad_x, grad_w, grad_b = norm_backward(grad_y, grad_s, y, rstd, weight, bias, p, seed, kind, needs)
        else:
            grad_w = grad_b = None
            total = grad_s.to(statistics_dtype(x_dtype)) if grad_s is not None else None
            if grad_y is not None:
                total_norm, grad_w, grad_b = _normalise_backward(grad_y, y, rstd, weight, bias, kind, needs)
                total = total_norm if total is None else total_norm.add_(total)
            grad_x = apply_dropout(total, p, seed)
        grad_residual = None
        if ctx.needs_input_grad[1]:
            grad_residual = total.to(residual_dtype).reshape(shape)
        return (
            grad_x.to(x_dtype).reshape(shape) if ctx.needs_input_grad[0] else None,
            grad_residual,
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            None, None, None, None, None,
        )


def _check(x, residual, weight, bias, kind) -> None:
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating tensor; got {x.dtype}")
    width = x.shape[-1]
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual must have x's shape {tuple(x.shape)}; got {tuple(residual.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.shape != (width,):
            raise ValueError(f"{name} must have shape ({width},) (x's last dimension); got {tuple(t.shape)}")
    if kind is not None and kind not in NORM_KINDS:
        raise ValueError(f"norm must be one of {NORM_KINDS}; got {kind!r}")


def dropout_add_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None,
                     bias: torch.Tensor | None = None, *, p: float = 0.0, eps: float = 1e-5, norm: NormKind = "layer",
                     prenorm: bool = False, training: bool = True, backend: Backend | None = None):
    """norm(residual + dropout(x)) over the last dimension; x, residual: (..., H); weight, bias: (H,).

    Returns y (..., H) in x's dtype, or with `prenorm=True` the pair (y, s) where
    s = residual + dropout(x) is the new residual stream. Saves y and rstd (..., 1) only."""
    check_probability("p", p)
    _check(x, residual, weight, bias, norm)
    return _DropoutAddNorm.apply(x, residual, weight, bias, p if training else 0.0, eps, norm, prenorm,
                                 resolve_backend(backend, x))


def dropout_add(x: torch.Tensor, residual: torch.Tensor, *, p: float = 0.0, training: bool = True,
                backend: Backend | None = None) -> torch.Tensor:
    """residual + dropout(x) for x, residual (..., H), saving nothing but the mask seed."""
    check_probability("p", p)
    _check(x, residual, None, None, None)
    return _DropoutAddNorm.apply(x, residual, None, None, p if training else 0.0, 0.0, None, False,
                                 resolve_backend(backend, x))


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None = None, eps: float = 1e-5,
               *, backend: Backend | None = None) -> torch.Tensor:
    """LayerNorm over the last dimension of x (..., H) with fp32 statistics, saving (y, rstd)."""
    return dropout_add_norm(x, None, weight, bias, eps=eps, norm="layer", backend=backend)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, *,
             backend: Backend | None = None) -> torch.Tensor:
    """RMSNorm over the last dimension of x (..., H) with fp32 statistics, saving (y, rstd)."""
    return dropout_add_norm(x, None, weight, None, eps=eps, norm="rms", backend=backend)


class Norm(nn.Module):
    """LayerNorm or RMSNorm module over the last dimension (`width`), with the fused forms as methods.

    State-dict names are `weight` (and `bias` for LayerNorm with bias), as in `nn.LayerNorm`."""

    def __init__(self, width: int, kind: NormKind = "layer", eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        if kind not in NORM_KINDS:
            raise ValueError(f"kind must be one of {NORM_KINDS}; got {kind!r}")
        self.kind, self.eps = kind, eps
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width)) if bias and kind == "layer" else None

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, *, p: float = 0.0,
                prenorm: bool = False):
        """norm(residual + dropout_p(x)); see `dropout_add_norm`. x: (..., width)."""
        return dropout_add_norm(x, residual, self.weight, self.bias, p=p, eps=self.eps, norm=self.kind,
                                prenorm=prenorm, training=self.training)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, kind={self.kind}, eps={self.eps}, bias={self.bias is not None}"
