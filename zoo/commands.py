"""Verbs of the `zoo` command line that other packages add: `zoo train` and `zoo plan` (`trainers`),
`zoo generate`, `zoo transcribe`, ... (the domains).

A package announces its verbs as `memzoo.commands` entry points (pyproject.toml) naming a `Command`,
so the CLI finds them without importing any of those packages itself.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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
    parser_options: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of the verb's sub-parser beside its help (`usage`, `add_help`)."""
    open_ended: bool = False
    """The verb takes `--field value` words of its own after its arguments (a recipe's or a model
    config's options): they reach `run` as `args.words` instead of being refused."""


def commands() -> dict[str, Command]:
    """Every registered verb by name (importing every package's command line)."""
    return named_entry_points(ENTRY_POINT_GROUP)


def command_names() -> list[str]:
    """The registered verbs' names, importing none of them."""
    return entry_point_names(ENTRY_POINT_GROUP)


def command_named(name: str) -> Command | None:
    """The registered verb `name`, importing its package's command line alone; None when none has it."""
    return entry_point_named(ENTRY_POINT_GROUP, name)


def ranked_line(path: str, labels: Sequence[str], probabilities: Sequence[float]) -> str:
    """One input's line of a classifying verb (`zoo classify`, `zoo spot`): "PATH: label p  label p ...",
    the labels as given (most probable first), each probability to four places."""
    return f"{path}: " + "  ".join(f"{label} {p:.4f}" for label, p in zip(labels, probabilities, strict=True))
