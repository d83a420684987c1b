"""The recipe table: `Recipe` specs found through `memzoo.recipes` entry points, and the parsing
of `--field value` overrides into a recipe's (nested dataclass) configuration."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zoo.plugins import entry_point_named, entry_point_names, named_entry_points
from zoo.recipe_options import closest_options, options

ENTRY_POINT_GROUP = "memzoo.recipes"


@dataclass(frozen=True)
class Recipe:
    """A runnable training recipe."""

    name: str
    """Name used by `zoo train NAME`."""
    config_class: type
    """Dataclass of its settings (may nest TrainConfig, Strategy, a model config)."""
    run: Callable[[Any], dict[str, Any]]
    """Runs the recipe on every rank; returns its metrics."""
    produces: tuple[str, ...]
    """Names of the zoo entries it writes (by default the first; options may select another)."""
    description: str
    """One line for `zoo list`."""


def recipes() -> dict[str, Recipe]:
    """Every installed recipe by name."""
    return named_entry_points(ENTRY_POINT_GROUP)


def get_recipe(name: str) -> Recipe:
    """The recipe `name` (importing that recipe alone); ValueError listing the known ones otherwise."""
    recipe = entry_point_named(ENTRY_POINT_GROUP, name)
    if recipe is None:
        raise ValueError(f"unknown recipe {name!r}; available: {entry_point_names(ENTRY_POINT_GROUP)}")
    return recipe


def recipe_producing(model_name: str) -> str | None:
    """Name of the recipe that writes zoo entry `model_name`, if any."""
    return next((r.name for r in recipes().values() if model_name in r.produces), None)


def _convert(text: str, annotation: Any, where: str) -> Any:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        for choice in args:
            if str(choice) == text:
                return choice
        raise ValueError(f"--{where} must be one of {list(args)}; got {text!r}")
    if origin in (typing.Union, types.UnionType):
        if text.lower() == "none" and type(None) in args:
            return None
        candidates = [a for a in args if a is not type(None)]
        for candidate in candidates[:-1]:  # the first type the text converts to (int before str)
            try:
                return _convert(text, candidate, where)
            except ValueError:
                pass
        return _convert(text, candidates[-1], where)
    if origin is dict:  # key=value,key=value
        pairs = [part.split("=", 1) for part in text.split(",") if part]
        if any(len(pair) != 2 for pair in pairs):
            raise ValueError(f"--{where} needs comma-separated key=value pairs; got {text!r}")
        return {_convert(key, args[0], where): _convert(value, args[1], where) for key, value in pairs}
    if origin is tuple and args[1:] == (Ellipsis,):
        return tuple(_convert(p, args[0], where) for p in text.split(",") if p)
    if origin is tuple:
        parts = text.split(",")
        if len(parts) != len(args):
            raise ValueError(f"--{where} needs {len(args)} comma-separated values; got {text!r}")
        return tuple(_convert(p, a, where) for p, a in zip(parts, args))
    if annotation is bool:
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"--{where} must be true or false; got {text!r}")
        return text.lower() in ("true", "1")
    try:
        return annotation(text)
    except (TypeError, ValueError) as error:
        raise ValueError(f"--{where} expects {getattr(annotation, '__name__', annotation)}; got {text!r}") from error


def parse_overrides(words: list[str]) -> dict[str, str]:
    """`--field value` and `--field=value` words as {field: value}; ValueError for any other word."""
    overrides = {}
    index = 0
    while index < len(words):
        word = words[index]
        if not word.startswith("--") or word == "--":
            raise ValueError(f"expected --field value; got {word!r}")
        if "=" in word:
            key, value = word[2:].split("=", 1)
            index += 1
        else:
            if index + 1 >= len(words):
                raise ValueError(f"{word} needs a value")
            key, value = word[2:], words[index + 1]
            index += 2
        overrides[key] = value
    return overrides


def apply_overrides(config: Any, overrides: dict[str, str]) -> Any:
    """Set dotted fields (`train.max_steps`, `strategy.zero`) of a nested dataclass from strings,
    converted to each field's annotated type; returns a new config. Each dataclass is rebuilt once
    with all of its new values, so its __post_init__ validates them together (in any flag order).
    A name that is no option is refused with the closest ones."""
    known = {option.name for option in options(config)}
    for dotted in overrides:
        if dotted not in known:
            close = closest_options(dotted, config)
            hint = f"; did you mean {', '.join('--' + name for name in close)}?" if close else ""
            raise ValueError(f"unknown option --{dotted}{hint} (zoo train RECIPE --help lists them all)")
    tree: dict[str, Any] = {}
    for dotted, text in overrides.items():  # every name is a leaf option: no name is another's section
        *path, leaf = dotted.split(".")
        branch = tree
        for part in path:
            branch = branch.setdefault(part, {})
        branch[leaf] = text
    return _rebuilt(config, tree, "")


def _rebuilt(owner: Any, tree: dict[str, Any], prefix: str) -> Any:
    """`owner` replaced with the values of `tree` {field: text or subtree}, converted to the
    fields' types; `prefix` is the dotted path to `owner` (for error messages)."""
    changes = {}
    for name, item in tree.items():
        dotted = prefix + name
        current = getattr(owner, name)
        changes[name] = (_rebuilt(current, item, dotted + ".") if isinstance(item, dict)
                         else _convert(item, typing.get_type_hints(type(owner))[name], dotted))
    return dataclasses.replace(owner, **changes)


def command_line(recipe: Recipe, config: Any, nproc: int) -> str:
    """The `zoo train` command that reproduces `config`: every field that differs from the
    recipe's default, as --dotted.field value."""
    words = [f"zoo train {recipe.name}"] + ([f"--nproc {nproc}"] if nproc > 1 else [])
    words += [f"--{name} {_as_word(value)}" for name, value in _differences(config, recipe.config_class(), "")]
    return " ".join(words)


def _differences(config: Any, default: Any, prefix: str) -> list[tuple[str, Any]]:
    found = []
    for field in dataclasses.fields(config):
        value, base = getattr(config, field.name), getattr(default, field.name)
        if dataclasses.is_dataclass(value):
            found += _differences(value, base, f"{prefix}{field.name}.")
        elif value != base:
            found.append((prefix + field.name, value))
    return found


def _as_word(value: Any) -> str:
    if isinstance(value, dict):
        text = ",".join(f"{key}={item}" for key, item in value.items())
    else:
        text = ",".join(map(_scalar_word, value)) if isinstance(value, tuple) else _scalar_word(value)
    return repr(text) if not text or any(c.isspace() for c in text) else text


def _scalar_word(value: Any) -> str:
    """A value as the command line writes it (booleans as true / false)."""
    return str(value).lower() if isinstance(value, bool) else str(value)
