"""`GradientsFromForward`: the backward of a fused loss that computed its gradients in forward."""

from __future__ import annotations

import torch


class GradientsFromForward(torch.autograd.Function):
    """Base of fused losses (`zoo.nn.cross_entropy`, `zoo.nn.vocab_parallel`) whose forward
    already formed the gradients of (hidden, weight, bias) for a unit loss. The forward saves
    them (None where not wanted), sets ctx.dtypes = (weight dtype, bias dtype) and ctx.other_inputs
    = the number of its inputs after those three; backward scales them by the incoming gradient in
    place, so that the loss's backward holds one copy of each (the output head's gradient, V x H in
    float32, is 196 MiB at GPT-2's vocabulary and width 1024). A second backward through the same
    graph (`retain_graph=True`) therefore stops at torch's check of modified saved tensors."""

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        weight_dtype, bias_dtype = ctx.dtypes
        scale = grad_loss.float()
        return (
            None if grad_hidden is None else grad_hidden.mul_(scale.to(grad_hidden.dtype)),
            None if grad_weight is None else grad_weight.mul_(scale).to(weight_dtype),
            None if grad_bias is None else grad_bias.mul_(scale).to(bias_dtype),
            *(None,) * ctx.other_inputs,
        )
