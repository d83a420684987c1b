"""`GradientsFromForward`: the backward of a fused loss that computed its gradients in forward."""

from __future__ import annotations

import torch

from zoo.torch_compat import graph_task_keeps_graph


class GradientsFromForward(torch.autograd.Function):
    """Base of fused losses (`zoo.nn.cross_entropy`, and `trainers.parallel.vocab` above it) whose forward
    already formed the gradients of (hidden, weight, bias) for a unit loss. The forward saves
    them (None where not wanted), sets ctx.dtypes = (weight dtype, bias dtype) and ctx.other_inputs
    = the number of its inputs after those three; backward scales them by the incoming gradient.

    It scales them in place unless the backward keeps the graph, so that the loss's backward holds
    one copy of each (the output head's gradient, V x H in float32, is 196 MiB at GPT-2's vocabulary
    and width 1024). A backward that keeps the graph (`retain_graph=True`: a second backward, a
    zero-bubble schedule's input pass before its weight pass) may read them again, so it gets
    scaled copies (the check AOTAutograd makes before it frees saved tensors). Under torch.compile
    it writes the out-of-place form, whose buffers the compiler reuses itself."""

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        weight_dtype, bias_dtype = ctx.dtypes
        scale = grad_loss.float()
        in_place = not torch.compiler.is_compiling() and not graph_task_keeps_graph()

        def scaled(gradient: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
            return gradient.mul_(factor) if in_place else gradient * factor

        return (
            None if grad_hidden is None else scaled(grad_hidden, scale.to(grad_hidden.dtype)),
            None if grad_weight is None else scaled(grad_weight, scale).to(weight_dtype),
            None if grad_bias is None else scaled(grad_bias, scale).to(bias_dtype),
            *(None,) * ctx.other_inputs,
        )
