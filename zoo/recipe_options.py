"""A recipe's options as `zoo train RECIPE --help` lists them: every dotted field of its nested config
dataclasses, with its type, default and docstring (the string literal under the field in the source,
read with `ast`, as the house style writes one for every field)."""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import textwrap
import types
import typing
from dataclasses import dataclass
from functools import cache
from typing import Any


@dataclass(frozen=True)
class Option:
    """One settable leaf field of a recipe's configuration."""

    name: str
    """Dotted path, as given on the command line without the leading --: "train.max_steps"."""
    type_name: str
    """What the value may be: "int", "fp32 | bf16 | fp16", "int or none", "float,float"."""
    default: Any
    """The recipe's default value."""
    doc: str
    """The field's docstring ("" when it has none)."""


@cache
def field_docs(cls: type) -> dict[str, str]:
    """{field: docstring} of dataclass `cls` and its dataclass bases, from the string literals that
    follow the fields in their source."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        except (OSError, TypeError, IndexError, AttributeError):  # no source: no docstrings
            continue
        for node, following in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                    and isinstance(following.value.value, str)):
                docs[node.target.id] = inspect.cleandoc(following.value.value)
    return docs


def type_name(annotation: Any) -> str:
    """How a value of `annotation` is written on the command line."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        named = [type_name(a) for a in args if a is not type(None)]
        return " | ".join(named) + (" or none" if type(None) in args else "")
    if origin is tuple:
        return f"{type_name(args[0])},..." if args[1:] == (Ellipsis,) else ",".join(type_name(a) for a in args)
    return getattr(annotation, "__name__", str(annotation))


def options(config: Any, prefix: str = "") -> list[Option]:
    """Every leaf field of the (nested) dataclass instance `config`, in declaration order."""
    hints, docs = typing.get_type_hints(type(config)), field_docs(type(config))
    found = []
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            found += options(value, f"{prefix}{field.name}.")
        else:
            found.append(Option(prefix + field.name, type_name(hints[field.name]), value, docs.get(field.name, "")))
    return found


def closest_options(name: str, config: Any) -> list[str]:
    """Up to three option names of `config` closest to the misspelled `name`."""
    names = [option.name for option in options(config)]
    leaves = {n.rsplit(".", 1)[-1]: n for n in names}
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    # A bare field name ("max_steps") or a misspelled one without its section still finds its option.
    close += [leaves[leaf] for leaf in difflib.get_close_matches(name.rsplit(".", 1)[-1], leaves, n=3, cutoff=0.75)]
    return list(dict.fromkeys(close))[:3]


def help_text(name: str, description: str, config: Any) -> str:
    """The `zoo train NAME --help` page: usage, then each option with its type, default and docstring."""
    lines = [f"usage: zoo train {name} [--nproc N] [--OPTION VALUE ...]", "", description, "",
             "  --nproc N  processes (ranks); more than 1 launches torchrun", "", "options:"]
    for option in options(config):
        default = ",".join(map(str, option.default)) if isinstance(option.default, tuple) else option.default
        lines.append(f"  --{option.name} {{{option.type_name}}}  (default: {default})")
        lines += textwrap.wrap(option.doc, width=96, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(lines) + "\n"
