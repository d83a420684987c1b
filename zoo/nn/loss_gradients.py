"""`GradientsFromForward`: the backward of a fused loss that computed its gradients in forward."""

from __future__ import annotations

import torch


class GradientsFromForward(torch.autograd.Function):
    """Base of fused losses (`zoo.nn.cross_entropy`, `zoo.nn.vocab_parallel`) whose forward
    already formed the gradients of (hidden, weight, bias) for a unit loss. The forward saves
    them (None where not wanted), sets ctx.dtypes = (weight dtype, bias dtype) and ctx.other_inputs
    = the number of its inputs after those three; backward scales them by the incoming gradient."""

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        weight_dtype, bias_dtype = ctx.dtypes
        scale = grad_loss.float()
        return (
            None if grad_hidden is None else grad_hidden * scale.to(grad_hidden.dtype),
            None if grad_weight is None else (grad_weight * scale).to(weight_dtype),
            None if grad_bias is None else (grad_bias * scale).to(bias_dtype),
            *(None,) * ctx.other_inputs,
        )
