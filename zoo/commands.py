"""Verbs of the `zoo` command line that the domain packages add (`zoo generate`, `zoo transcribe`, ...).

A domain announces its verbs as `memzoo.commands` entry points (pyproject.toml) naming a `Command`,
so the CLI finds them without importing any domain itself.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from zoo.plugins import entry_point_named, entry_point_names, named_entry_points

ENTRY_POINT_GROUP = "memzoo.commands"


@dataclass(frozen=True)
class Command:
    """One verb of the `zoo` command line."""

    name: str
    """The verb: `zoo NAME ...`."""
    help: str
    """One line for `zoo --help`."""
    add_arguments: Callable[[argparse.ArgumentParser], None]
    """Declares the verb's arguments on its sub-parser."""
    run: Callable[[argparse.Namespace], None]
    """Runs the verb; raises ValueError (or OSError) with a message for the user on bad input."""


def commands() -> dict[str, Command]:
    """Every installed domain verb by name (importing every domain's command line)."""
    return named_entry_points(ENTRY_POINT_GROUP)


def command_names() -> list[str]:
    """The installed domain verbs' names, importing none of them."""
    return entry_point_names(ENTRY_POINT_GROUP)


def command_named(name: str) -> Command | None:
    """The domain verb `name`, importing its domain's command line alone; None when no domain has it."""
    return entry_point_named(ENTRY_POINT_GROUP, name)
