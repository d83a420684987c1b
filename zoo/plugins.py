"""Objects that installed packages announce as entry points (recipes, CLI verbs), loaded by name."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any


def named_entry_points(group: str) -> dict[str, Any]:
    """The objects of entry-point `group`, each loaded and keyed by its own `name` attribute."""
    loaded = (entry.load() for entry in entry_points(group=group))
    return {item.name: item for item in loaded}
