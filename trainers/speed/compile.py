"""`Strategy.compile`: torch.compile applied where the strategy's other transformations leave it.

"blocks" compiles the forward of each block of the model's plan (torchtitan's choice: one graph a
block, reused by every block of the same shape), fullgraph: a block that does not compile whole
fails at its first forward with torch's reason and the line that caused it. Under tensor
parallelism the regions' edges stay eager (`trainers.parallel.styles.eager`), and under expert
parallelism the experts' dispatch (`trainers.parallel.experts`), so a block compiles in the pieces
between them. "model" compiles the whole model's forward, graph breaks allowed
(`TORCH_LOGS=graph_breaks` lists them).

It runs after tensor parallelism and recompute and before data parallelism
(`trainers.parallelize`), and compiles `forward`, not `__call__`: the hooks the other layers
install (FSDP2's gathers and reductions, tensor-parallel regions, axial scopes) run around the
compiled graph, and what a block keeps for backward is decided inside it (a recompute wrapper's
checkpoint is traced as one region that the compiler's partitioner reruns in backward).

The partitioner, which decides what a compiled graph keeps for backward, runs with the activation
budget `PARTITION_BUDGET`: its default keeps the activation output of a feed-forward layer, which
the zoo's fused ops recompute in backward, so compiled blocks would keep more than eager ones. A
block that recompute keeps selected operators of (`trainers.memory.recompute`: "matmuls" or a
budget's choice) is partitioned as those choices say instead, with the default budget (Inductor
fails on the two together).

A compiled forward runs eagerly while a dispatch mode watches the operators (the trainer's memory
probe and FLOP count on their measured steps, the estimator's fake trace): a compiled graph hides
its operators from such a mode, and torch.compile refuses to trace under one. The first such run
is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from trainers.memory.recompute import RecomputePolicy
from trainers.strategy import Strategy
from zoo.torch_compat import current_dispatch_modes, partitioner_memory_budget

log = logging.getLogger(__name__)

PARTITION_BUDGET = 0.9
"""The fraction, between recomputing all it can (0) and its speed-first default (1), of the
activations the compiler's partitioner keeps: below 1 it recomputes cheap element-wise results
(an activation function's output) rather than keep them, as the zoo's fused ops do."""


def _no_selection() -> bool:
    """No recompute policy keeps selected operators (the partitioner's own budget applies)."""
    return False


class CompiledForward:
    """A module's `forward`, compiled, and run eagerly while a dispatch mode is active; counts the
    calls each way (`compiled_calls`, `eager_calls`). `selective()` says, at each call, whether
    recompute keeps selected operators of the module (its graph is then partitioned as they say)."""

    def __init__(self, forward: Callable[..., Any], backend: str, fullgraph: bool,
                 selective: Callable[[], bool] | None = None) -> None:
        self.eager, self.selective = forward, selective or _no_selection
        self.compiled = torch.compile(forward, backend=backend, fullgraph=fullgraph)
        self.compiled_calls = self.eager_calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        modes = current_dispatch_modes()
        if modes:
            if self.eager_calls == 0 and self.compiled_calls == 0:
                log.info("a compiled forward runs eagerly under %s, which must see each operator",
                         ", ".join(type(mode).__name__ for mode in modes))
            self.eager_calls += 1
            return self.eager(*args, **kwargs)
        self.compiled_calls += 1
        with partitioner_memory_budget(1.0 if self.selective() else PARTITION_BUDGET):
            return self.compiled(*args, **kwargs)


def apply_compile(model: nn.Module, strategy: Strategy, block_names: Iterable[str],
                  recompute: RecomputePolicy | None = None) -> None:
    """Compile `model` in place as `strategy.compile` says (nothing for "none"); parameter and
    state-dict names are unchanged. `recompute` is the policy the blocks run under, if any.
    ValueError for "blocks" on a model whose plan names none."""
    if strategy.compile == "none":
        return
    if strategy.compile == "model":
        model.forward = CompiledForward(model.forward, strategy.compile_backend, fullgraph=False)
        return
    names = list(block_names)
    if not names:
        raise ValueError(f"Strategy.compile='blocks' compiles each block of the model's plan, but "
                         f"{type(model).__name__} declares none (define parallel_plan() returning "
                         "zoo.plan.ModelPlan, or use compile='model')")
    for name in names:
        block = model.get_submodule(name)
        selective = (lambda name=name: recompute.keep.get(name) not in (None, "all", "inputs")) if recompute else _no_selection
        block.forward = CompiledForward(block.forward, strategy.compile_backend, strategy.tp == 1 and strategy.ep == 1,
                                        selective)


def compiled_forwards(model: nn.Module) -> list[CompiledForward]:
    """The compiled forwards of `model` and its modules."""
    return [module.forward for module in model.modules() if isinstance(module.forward, CompiledForward)]
