"""Low-rank adapters (LoRA, Hu et al. 2021) on any model's linear layers, laid out as PEFT lays them.

A target `nn.Linear` stays where it is, weights and all (so its name, and every parallel plan that
names it, hold), and gains two children: `lora_A` (rank x in, Kaiming-uniform as PEFT draws it) and
`lora_B` (out x rank, zeros), plus a forward hook that adds what PEFT's LoRA layer adds:

    y = linear(x) + lora_B(lora_A(dropout(x))) * alpha / rank

Their state-dict names (`....q_proj.lora_A.weight`) are PEFT's with its "base_model.model." prefix
and adapter name removed (`zoo.adapters.peft_format` writes and reads them). Every parameter but the
adapters' is frozen (requires_grad False). A target whose module the model never calls (a head the
fused loss reads by weight, `zoo.nn`'s fused feed-forward) would train nothing: `Reached` checks a
forward against that.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

ALL_LINEAR = "all-linear"
"""`LoRA.targets` meaning every `nn.Linear` but the output head (PEFT's "all-linear")."""


@dataclass(frozen=True)
class LoRA:
    """Low-rank adapters on a model's linear layers: only they train, the base stays frozen."""

    rank: int = 8
    """Rank r of each adapter: lora_A is (r, in), lora_B (out, r); at most min(in, out) of its layer."""
    alpha: float = 16.0
    """Scale numerator: the adapter's output is multiplied by alpha / rank."""
    dropout: float = 0.0
    """Dropout on the adapter's input while training (PEFT's lora_dropout)."""
    targets: str | tuple[str, ...] = ALL_LINEAR
    """Which linears get adapters, as PEFT's target_modules: a tuple of names, each matching a module
    whose name is it or ends in "." + it ("q_proj" matches "model.layers.0.self_attn.q_proj"); a str,
    a regular expression the whole module name must match; or "all-linear": every `nn.Linear` but the
    output head (`get_output_embeddings()` where the model has it)."""

    def __post_init__(self) -> None:
        if isinstance(self.targets, list):
            object.__setattr__(self, "targets", tuple(self.targets))
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise ValueError(f"LoRA.rank must be an int >= 1; got {self.rank!r}")
        if not isinstance(self.alpha, (int, float)) or isinstance(self.alpha, bool) or not math.isfinite(self.alpha) \
                or self.alpha <= 0:
            raise ValueError(f"LoRA.alpha must be a finite number > 0; got {self.alpha!r}")
        if not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoRA.dropout must be in [0, 1); got {self.dropout!r}")
        if not (isinstance(self.targets, str) and self.targets) and not (
                isinstance(self.targets, tuple) and self.targets and all(isinstance(t, str) and t for t in self.targets)):
            raise ValueError(f"LoRA.targets must be a non-empty tuple of module names, a regular expression or "
                             f"{ALL_LINEAR!r}; got {self.targets!r}")

    @property
    def scaling(self) -> float:
        """What the adapter's output is multiplied by: alpha / rank."""
        return self.alpha / self.rank


class LoRADown(nn.Linear):
    """An adapter's first projection, lora_A (rank x in, no bias): Kaiming-uniform, as PEFT starts it."""

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))


class LoRAUp(nn.Linear):
    """An adapter's second projection, lora_B (out x rank, no bias): zeros, so that a new adapter
    leaves the model's outputs as they were."""

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight)


def targeted(model: nn.Module, targets: str | tuple[str, ...]) -> list[str]:
    """Names of the modules of `model` that `targets` (`LoRA.targets`) selects, in module order;
    ValueError naming the targets when one matches no module or a match is not an `nn.Linear`."""
    modules = dict(model.named_modules())
    if targets == ALL_LINEAR:
        head = model.get_output_embeddings() if callable(getattr(model, "get_output_embeddings", None)) else None
        names = [name for name, module in modules.items() if type(module) is nn.Linear and module is not head]
        if not names:
            raise ValueError(f"LoRA.targets={ALL_LINEAR!r}: {type(model).__name__} has no nn.Linear besides its output head")
        return names
    if isinstance(targets, str):
        pattern = re.compile(targets)
        names = [name for name in modules if name and pattern.fullmatch(name)]
        if not names:
            raise ValueError(f"LoRA.targets={targets!r} (a regular expression) matches no module name of "
                             f"{type(model).__name__} (e.g. {_some_linears(modules)})")
    else:
        unmatched = [t for t in targets if not any(name == t or name.endswith("." + t) for name in modules)]
        if unmatched:
            raise ValueError(f"LoRA.targets {unmatched} match no module of {type(model).__name__} (its linears are "
                             f"named e.g. {_some_linears(modules)})")
        names = [name for name in modules if name and any(name == t or name.endswith("." + t) for t in targets)]
    wrong = [f"{name} ({type(modules[name]).__name__})" for name in names if not isinstance(modules[name], nn.Linear)]
    if wrong:
        raise ValueError(f"LoRA.targets={targets!r} selects modules that are not nn.Linear: {wrong[:4]}; LoRA adapts "
                         f"linear layers only")
    return names


def _some_linears(modules: dict[str, nn.Module]) -> str:
    linears = [name for name, module in modules.items() if isinstance(module, nn.Linear)]
    return ", ".join(linears[:4]) if linears else "none: it has no nn.Linear"


def attach_lora(model: nn.Module, lora: LoRA) -> list[str]:
    """Give every linear of `model` that `lora.targets` selects an adapter (in place, on the device
    and in the dtype of its weight) and freeze every other parameter; returns the adapted modules'
    names. ValueError for a model that already has adapters, on the meta device (an adapter adapts
    weights the model has), or for a rank above a target's min(in, out)."""
    if adapted_modules(model):
        raise ValueError(f"{type(model).__name__} already has LoRA adapters ({adapted_modules(model)[0]}, ...); "
                         f"merge_lora or build the model again before attaching others")
    if any(p.is_meta for p in model.parameters()):
        raise ValueError(f"LoRA adapts a model's own weights, but {type(model).__name__} is on the meta device (no "
                         f"weights); build or load it on a real device")
    names = targeted(model, lora.targets)
    modules = dict(model.named_modules())
    too_small = [f"{name} ({modules[name].in_features} -> {modules[name].out_features})" for name in names
                 if lora.rank > min(modules[name].in_features, modules[name].out_features)]
    if too_small:
        raise ValueError(f"LoRA.rank={lora.rank} is larger than min(in, out) of {too_small[:4]}: such an adapter is "
                         f"no low-rank update")
    for param in model.parameters():
        param.requires_grad_(False)
    for name in names:
        linear = modules[name]
        factory = {"device": linear.weight.device, "dtype": linear.weight.dtype}
        linear.lora_A = LoRADown(linear.in_features, lora.rank, bias=False, **factory)
        linear.lora_B = LoRAUp(lora.rank, linear.out_features, bias=False, **factory)
        linear.lora_scaling = lora.scaling
        linear.lora_dropout = lora.dropout
        linear.lora_hook = linear.register_forward_hook(_add_low_rank, with_kwargs=True)
    return names


def _add_low_rank(linear: nn.Linear, args: tuple, kwargs: dict, output: torch.Tensor) -> torch.Tensor:
    """The hook of an adapted linear: its output plus lora_B(lora_A(dropout(x))) * scaling."""
    x = args[0] if args else kwargs["input"]
    down, up = linear.lora_A, linear.lora_B
    x = x.to(down.weight.dtype)
    if linear.lora_dropout and linear.training:
        x = F.dropout(x, linear.lora_dropout)
    return output + (up(down(x)) * linear.lora_scaling).to(output.dtype)


def adapted_modules(model: nn.Module) -> list[str]:
    """Names of the modules of `model` that carry a LoRA adapter."""
    return [name for name, module in model.named_modules() if isinstance(getattr(module, "lora_A", None), LoRADown)]


def is_adapter_parameter(name: str) -> bool:
    """Whether the parameter called `name` (a state-dict name) is an adapter's."""
    return ".lora_A." in f".{name}" or ".lora_B." in f".{name}"


@torch.no_grad()
def merge_lora(model: nn.Module) -> list[str]:
    """Fold every adapter of `model` into its linear (weight += lora_B.weight @ lora_A.weight x
    scaling, computed in float64 and rounded once to the weight's dtype), remove the adapters and
    their hooks, and make every parameter trainable again; returns the merged modules' names."""
    names = adapted_modules(model)
    modules = dict(model.named_modules())
    for name in names:
        linear = modules[name]
        delta = linear.lora_B.weight.double() @ linear.lora_A.weight.double() * linear.lora_scaling
        linear.weight.copy_((linear.weight.double() + delta).to(linear.weight.dtype))
        linear.lora_hook.remove()
        del linear.lora_A, linear.lora_B, linear.lora_scaling, linear.lora_dropout, linear.lora_hook
    for param in model.parameters():
        param.requires_grad_(True)
    return names


@contextmanager
def reached(model: nn.Module) -> Iterator[None]:
    """Check that the forwards run inside call every adapted module of `model`: ValueError naming
    those they did not (an adapter on a linear whose weight the model reads directly, as a fused
    head or feed-forward does, would train nothing and change nothing)."""
    seen: set[str] = set()
    modules = dict(model.named_modules())
    handles = [modules[name].register_forward_hook(lambda *_, name=name: seen.add(name))
               for name in adapted_modules(model)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
    missed = [name for name in adapted_modules(model) if name not in seen]
    if missed:
        raise ValueError(f"LoRA adapters on {missed[:4]}{' ...' if len(missed) > 4 else ''} were never called: "
                         f"{type(model).__name__} reads these linears' weights without calling them (a fused head or "
                         f"feed-forward), so their adapters would train nothing; leave them out of LoRA.targets")
