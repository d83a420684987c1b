"""`ModelPlan`: what a model declares about itself so that `trainers/` can parallelise it.

Models hold no distributed code. A model that wants per-block sharding and recompute defines

    def parallel_plan(self) -> ModelPlan:
        return ModelPlan(blocks=("blocks.*",))

and `trainers.parallelize` applies the `Strategy` to the modules the plan names. A model without
a `parallel_plan` method trains as one unit.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class ModelPlan:
    """Names of a model's parallelisation units, as patterns over `named_modules()` names."""

    blocks: tuple[str, ...] = ()
    """Patterns of the repeated blocks, matched segment by segment with fnmatch ("blocks.*" matches
    "blocks.0" but not "blocks.0.attn"): each block is one FSDP unit (its parameters gathered
    together) and one recompute unit."""

    colwise: tuple[str, ...] = ()
    """Patterns of the `nn.Linear`s to split by output features under tensor parallelism
    (attention qkv, the first feed-forward linear). A declaration only: `trainers` applies no tensor
    parallelism yet, and `linear_names` just checks that the patterns name linears."""
    rowwise: tuple[str, ...] = ()
    """Patterns of the `nn.Linear`s to split by input features (attention output, second
    feed-forward linear), each following a column-parallel one. A declaration only, like `colwise`."""

    def block_names(self, model: nn.Module) -> list[str]:
        """Names of the modules of `model` matched by `blocks`, in `named_modules()` order.

        Raises ValueError when a pattern matches nothing, so a renamed module cannot silently
        turn per-block sharding off."""
        return _resolve(model, self.blocks, "blocks")

    def linear_names(self, model: nn.Module) -> tuple[list[str], list[str]]:
        """(column-parallel, row-parallel) names of `model`'s linears; ValueError when a pattern
        matches nothing or a match is not an `nn.Linear`."""
        found = _resolve(model, self.colwise, "colwise"), _resolve(model, self.rowwise, "rowwise")
        modules = dict(model.named_modules())
        for name in found[0] + found[1]:
            if not isinstance(modules[name], nn.Linear):
                raise ValueError(f"ModelPlan names {name!r} as a parallel linear; it is a {type(modules[name]).__name__}")
        return found


def _resolve(model: nn.Module, patterns: tuple[str, ...], field: str) -> list[str]:
    names = [name for name, _ in model.named_modules() if name]
    matched: set[str] = set()
    for pattern in patterns:
        hits = [name for name in names if _matches(name, pattern)]
        if not hits:
            raise ValueError(
                f"ModelPlan.{field} pattern {pattern!r} matches no submodule of "
                f"{type(model).__name__}; its top-level children are {[n for n, _ in model.named_children()]}"
            )
        matched.update(hits)
    return [name for name in names if name in matched]


def _matches(name: str, pattern: str) -> bool:
    parts, wanted = name.split("."), pattern.split(".")
    return len(parts) == len(wanted) and all(map(fnmatch.fnmatchcase, parts, wanted))


def model_plan(model: nn.Module) -> ModelPlan:
    """The plan `model` declares, or an empty plan (the whole model is one unit)."""
    declare = getattr(model, "parallel_plan", None)
    if declare is None:
        return ModelPlan()
    plan = declare()
    if not isinstance(plan, ModelPlan):
        raise TypeError(
            f"{type(model).__name__}.parallel_plan() must return zoo.plan.ModelPlan; got {type(plan).__name__}"
        )
    return plan
