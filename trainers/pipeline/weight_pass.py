"""The weight-gradient half of a split backward (a zero-bubble schedule's "W" pass), in one
backward over all of a stage's parameters.

torch's `stage_backward_input` computes a stage's input gradients and keeps, per group of
parameters, the graph nodes where the weight-only part of the graph hangs off the input path
("intermediates") with their gradients. Its `stage_backward_weight` then runs one backward per
group, freeing each group's part of the graph as it goes; but groups can share nodes (the
Evoformer's do), and the second group then meets freed buffers. Keeping the graph instead
(`retain_graph=True`) keeps what each group's backward recomputes of a checkpointed block alive
until the pass ends: the folding model's last stage under zero-bubble with block recompute
peaked at 6,402 MiB that way, 295 MiB with `weight_pass` (`benchmarks/pipeline_estimate.py`).

`weight_pass` runs one backward from every group's intermediates at once, each intermediate's
incoming gradient pinned to the one the input pass saved (as torch pins them within a group), so
a gradient that reaches an intermediate through another is not counted twice. Each node runs
once, frees its buffers, and each parameter gets dL/dW in full.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.autograd.graph import GradientEdge, get_gradient_edge
from torch.nn import Parameter


def weight_pass(params: Iterable[Parameter], param_groups: list[dict[str, Any]]) -> None:
    """Accumulate into `params`' .grad their gradients from `param_groups`, what
    `stage_backward_input` returned for the stage's last input pass of this micro batch."""
    by_accumulator = {get_gradient_edge(param).node: param for param in params}
    pairs = [pair for group in param_groups for pair in zip(group["grads"], group["intermediates"], strict=True)]
    accumulators = [accumulator for group in param_groups for accumulator in group["params"]]
    for group in param_groups:  # the hooks below hold the intermediates; nothing else should
        del group["grads"], group["intermediates"]
    edges, outputs = [], []
    for grads, intermediate in pairs:
        for index, grad in enumerate(grads):
            if grad is not None:
                edges.append(GradientEdge(intermediate, index))
                outputs.append(grad)
    if not edges:
        return
    handles = [intermediate.register_prehook(lambda _, saved=grads: saved) for grads, intermediate in pairs
               ] if len(pairs) > 1 else []
    try:
        dweights = torch.autograd.grad(edges, [GradientEdge(a, 0) for a in accumulators], grad_outputs=outputs)
    finally:
        for handle in handles:
            handle.remove()
    for accumulator, grad in zip(accumulators, dweights, strict=True):
        param = by_accumulator[accumulator]
        if param.grad is None:
            param.grad = grad
        else:
            param.grad += grad
