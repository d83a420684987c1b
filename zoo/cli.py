"""The `zoo` command line: list, info and export, plus the verbs other packages register
(`zoo.commands`: train and plan from `trainers`, generate, classify, transcribe and fold from the
domains). It imports none of those packages: each verb's module is imported when it is asked for."""

from __future__ import annotations

import argparse
import sys

from zoo.commands import Command, command_named, command_names, commands as registered_commands
from zoo.logs import LEVELS, configure_logging
from zoo.model_folder import CARD_FILE
from zoo.recipes import recipes
from zoo.store import list_models, locate, read_config


def cmd_list(_: argparse.Namespace) -> None:
    models, found_recipes = list_models(), recipes()
    width = max(map(len, [*models, *(f"recipe {name}" for name in found_recipes)]), default=0)
    archs = {name: read_config(folder)["arch"] for name, folder in models.items()}
    arch_width = max(map(len, archs.values()), default=0)
    for name, folder in models.items():
        print(f"{name:{width}s} {archs[name]:{arch_width}s} {folder}")
    for name, recipe in found_recipes.items():
        print(f"{'recipe ' + name:{width}s} -> {', '.join(recipe.produces)}: {recipe.description}")


def cmd_info(args: argparse.Namespace) -> None:
    print((locate(args.name) / CARD_FILE).read_text())


def cmd_export(args: argparse.Namespace) -> None:
    from zoo.hf import export_hf
    from zoo.store import load

    print(export_hf(load(args.name), args.directory))


BUILT_IN = ("list", "info", "export")
"""The verbs of this module; the others are registered (`zoo.commands`)."""


def requested_verb(argv: list[str]) -> str | None:
    """The verb `argv` asks for: its first word that is no option (nor --log-level's value)."""
    words = iter(argv)
    for word in words:
        if word == "--log-level":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def verbs_to_load(verb: str | None) -> list[Command]:
    """The registered verbs the parser needs for `verb`: none for a built-in verb, that one alone for
    a registered one (so that only its package is imported), and all of them otherwise (for --help,
    or an unknown verb's error that lists every choice)."""
    if verb in BUILT_IN:
        return []
    if verb in command_names():
        return [command_named(verb)]
    return list(registered_commands().values())


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser, with the registered verbs that `verb` needs (`verbs_to_load`)."""
    parser = argparse.ArgumentParser(prog="zoo", description="memzoo: train and use memory-lean models")
    parser.add_argument("--log-level", choices=LEVELS, default=None,
                        help="least severe log records shown (default: info, or $MEMZOO_LOG_LEVEL)")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="models and recipes")
    info = commands.add_parser("info", help="show a model's card")
    info.add_argument("name")
    export = commands.add_parser("export", help="write a model as a Hugging Face folder (GPT-2, BERT)")
    export.add_argument("name")
    export.add_argument("directory")
    for command in verbs_to_load(verb):
        command.add_arguments(commands.add_parser(command.name, help=command.help, **command.parser_options))
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(requested_verb(argv))
    args, rest = parser.parse_known_args(argv)
    configure_logging(args.log_level)  # torchrun's ranks inherit the level through the environment
    try:
        built_in = {"list": cmd_list, "info": cmd_info, "export": cmd_export}
        command = None if args.command in built_in else command_named(args.command)
        if command is not None and command.open_ended:
            args.words = rest
        elif rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        (built_in[args.command] if command is None else command.run)(args)
    except (ValueError, OSError) as error:  # bad input, or a file the user named that cannot be used
        parser.exit(2, f"zoo: error: {error}\n")


if __name__ == "__main__":
    main()
