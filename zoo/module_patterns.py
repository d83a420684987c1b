"""Module-name patterns of parallel plans: "blocks.*.attn" matches `named_modules()` names segment by
segment, each segment an fnmatch pattern ("blocks.*" matches "blocks.0", not "blocks.0.attn")."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable


def matches(name: str, pattern: str) -> bool:
    """Whether the module name `name` matches `pattern`, segment by segment."""
    parts, wanted = name.split("."), pattern.split(".")
    return len(parts) == len(wanted) and all(map(fnmatch.fnmatchcase, parts, wanted))


def within(name: str, parents: Iterable[str]) -> bool:
    """Whether the module name `name` is one of `parents` or lies inside one ("" names no module)."""
    return any(name == parent or name.startswith(parent + ".") for parent in parents if parent)
