"""Architectures by name: `register`, `create`, `arch_of`.

Domain packages announce their architectures as `memzoo.models` entry points (pyproject.toml), so
the zoo finds them without importing any domain itself; `register` adds more at run time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, TypeVar

from torch import nn

ENTRY_POINT_GROUP = "memzoo.models"
ModelClass = TypeVar("ModelClass", bound=type[nn.Module])


@dataclass(frozen=True)
class Architecture:
    """A registered model family."""

    name: str
    """Registry key, e.g. "gpt"."""
    model_class: type[nn.Module]
    """The nn.Module subclass; constructed as model_class(config)."""
    config_class: type
    """Dataclass of its configuration."""


_REGISTRY: dict[str, Architecture] = {}
_ENTRY_POINTS_LOADED = False


def register(name: str, config_class: type) -> Callable[[ModelClass], ModelClass]:
    """Class decorator: `@register("gpt", GPTConfig)` makes `create("gpt", **fields)` build it."""
    if not dataclasses.is_dataclass(config_class):
        raise TypeError(f"config_class must be a dataclass; got {config_class!r}")

    def decorate(model_class: ModelClass) -> ModelClass:
        existing = _REGISTRY.get(name)
        if existing is not None and existing.model_class is not model_class:
            raise ValueError(f"architecture {name!r} is already registered to {existing.model_class.__qualname__}")
        _REGISTRY[name] = Architecture(name, model_class, config_class)
        return model_class

    return decorate


def _load_entry_points() -> None:
    global _ENTRY_POINTS_LOADED
    if not _ENTRY_POINTS_LOADED:
        _ENTRY_POINTS_LOADED = True
        for entry in entry_points(group=ENTRY_POINT_GROUP):
            entry.load()  # importing the module runs its @register decorators


def architectures() -> dict[str, Architecture]:
    """Every registered architecture by name."""
    _load_entry_points()
    return dict(_REGISTRY)


def get_architecture(name: str) -> Architecture:
    """The architecture registered as `name`; ValueError listing the known ones otherwise."""
    known = architectures()
    if name not in known:
        raise ValueError(f"unknown architecture {name!r}; registered: {sorted(known)}")
    return known[name]


def create(arch: str, **config: Any) -> nn.Module:
    """Build a freshly initialised model: `create("gpt", n_layer=4, n_embd=128)`."""
    architecture = get_architecture(arch)
    fields = {field.name for field in dataclasses.fields(architecture.config_class)}
    unknown = sorted(set(config) - fields)
    if unknown:
        raise ValueError(f"unknown {architecture.config_class.__name__} fields {unknown}; expected some of {sorted(fields)}")
    return architecture.model_class(architecture.config_class(**config))


def arch_of(model: nn.Module) -> Architecture:
    """The registered architecture `model` is an instance of."""
    for architecture in architectures().values():
        if type(model) is architecture.model_class:
            return architecture
    raise ValueError(f"{type(model).__qualname__} is not a registered architecture; decorate it with zoo.register")
