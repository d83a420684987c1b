"""Objects that installed packages announce as entry points (recipes, CLI verbs), loaded by name.

Loading an entry point imports its package (a domain, its recipe, torch.distributed): about a
second each. A caller that needs one object names it (`entry_point_named`), and only that one is
imported; the names alone (`entry_point_names`) import nothing."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any


def entry_point_names(group: str) -> list[str]:
    """The names entry-point `group` announces, sorted, without loading any."""
    return sorted({entry.name for entry in entry_points(group=group)})


def entry_point_named(group: str, name: str) -> Any | None:
    """The object announced as `name` in entry-point `group` (None when none is), loaded alone; its
    own `name` attribute must be the announced one."""
    announced = [entry for entry in entry_points(group=group) if entry.name == name]
    if not announced:
        return None
    item = announced[0].load()
    if item.name != name:
        raise ValueError(f"entry point {name!r} of group {group!r} loads an object named {item.name!r}")
    return item


def named_entry_points(group: str) -> dict[str, Any]:
    """The objects of entry-point `group`, each loaded and keyed by its announced name."""
    return {name: entry_point_named(group, name) for name in entry_point_names(group)}
