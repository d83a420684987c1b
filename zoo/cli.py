"""The `zoo` command line: list, info, train, plan and export, plus the verbs the domains register
(`zoo.commands`: generate, classify, transcribe, fold). It imports no domain package."""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
from typing import Any

from zoo.commands import Command, command_named, command_names, commands as domain_commands
from zoo.logs import LEVELS, configure_logging
from zoo.model_folder import CARD_FILE
from zoo.plan_command import PLAN_USAGE, add_plan_arguments, cmd_plan
from zoo.recipe_options import help_text, options
from zoo.recipes import apply_overrides, get_recipe, recipes
from zoo.store import list_models, locate, read_config

TRAIN_USAGE = ("zoo train RECIPE [--nproc N] [--tp T [--sequence-parallel]] [--pp P [--pp-schedule S] "
               "[--microbatches M] [--stages-per-rank V]] [--offload chunks --offload-dir DIR --memory BYTES "
               "[--device-memory BYTES] [--swap-activations BYTES]] [--OPTION VALUE ...]   (zoo train RECIPE --help lists its options)")


def _parse_overrides(words: list[str]) -> dict[str, str]:
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


def check_ranks(config: Any, nproc: int) -> None:
    """Before any process starts: --nproc must be >= 1, a multiple of the strategy's tensor- and
    pipeline-parallel degrees, and split every TrainConfig's global batch into whole micro batches
    per data-parallel rank (and those into the pipeline's runs, which its schedule must take);
    more ranks than cores is allowed, with a warning."""
    from trainers import Strategy, TrainConfig
    from trainers.data import check_batch_sizes, pipeline_microbatches
    from trainers.pipeline_schedules import check_schedule

    if nproc < 1:
        raise ValueError(f"--nproc must be >= 1; got {nproc}")
    values = _dataclass_values(config)
    strategy = next((value for value in values if isinstance(value, Strategy)), Strategy())
    tp, pp = strategy.tp, strategy.pp
    if nproc % tp:
        raise ValueError(f"--nproc {nproc} must be a multiple of the tensor-parallel degree --tp {tp}")
    if nproc % (tp * pp):
        raise ValueError(f"--nproc {nproc} must be a multiple of --pp {pp} x --tp {tp} = {pp * tp}")
    cores = os.cpu_count() or 1
    if nproc > cores:
        print(f"zoo: warning: --nproc {nproc} is more than this machine's {cores} cores; the ranks will share them",
              file=sys.stderr)
    for train in (value for value in values if isinstance(value, TrainConfig)):
        try:
            dp = nproc // (tp * pp)
            check_batch_sizes(train.global_batch_size, train.micro_batch_size, dp)
            if pp > 1:
                microbatches = pipeline_microbatches(train.global_batch_size, train.micro_batch_size, dp,
                                                     strategy.microbatches)
                check_schedule(strategy.pp_schedule, pp, strategy.stages_per_rank, microbatches)
        except ValueError as error:
            degrees = f"{f' --tp {tp}' if tp > 1 else ''}{f' --pp {pp}' if pp > 1 else ''}"
            raise ValueError(f"--nproc {nproc}{degrees}: {error}") from None


STRATEGY_FLAGS = {"tp": "strategy.tp", "pp": "strategy.pp", "pp_schedule": "strategy.pp_schedule",
                  "microbatches": "strategy.microbatches", "stages_per_rank": "strategy.stages_per_rank",
                  "offload": "strategy.offload", "offload_dir": "strategy.offload_dir", "memory": "strategy.memory_budget",
                  "device_memory": "strategy.device_memory_budget", "swap_activations": "strategy.swap_activations"}
"""`zoo train` flags that stand for recipe options of the strategy (with --sequence-parallel)."""


def strategy_overrides(args: argparse.Namespace, config: Any) -> list[str]:
    """--tp, --sequence-parallel, --pp, --pp-schedule, --microbatches, --stages-per-rank, --offload,
    --offload-dir, --memory, --device-memory and --swap-activations as the recipe options they stand for
    (strategy.*); ValueError for a recipe without a strategy."""
    words = [word for flag, option in STRATEGY_FLAGS.items() if getattr(args, flag) is not None
             for word in (f"--{option}", str(getattr(args, flag)))]
    words += ["--strategy.sequence_parallel", "true"] if args.sequence_parallel else []
    if words and not any(option.name == "strategy.tp" for option in options(config)):
        raise ValueError(f"--tp, --pp, --offload and their companions set the recipe's strategy; "
                         f"{type(config).__name__} has none")
    return words


def microbatch_overrides(config: Any, nproc: int) -> list[str]:
    """With --microbatches M: the micro batch size that cuts each data-parallel rank's share of the
    global batch into exactly M micro batches (--train.micro_batch_size); ValueError when it does not split."""
    from trainers import Strategy, TrainConfig

    strategy = getattr(config, "strategy", None)
    train = getattr(config, "train", None)
    if not isinstance(strategy, Strategy) or not isinstance(train, TrainConfig) or strategy.microbatches is None:
        return []
    share = train.global_batch_size // max(nproc // (strategy.tp * strategy.pp), 1)
    if share % strategy.microbatches or train.global_batch_size % (share or 1):
        raise ValueError(f"--microbatches {strategy.microbatches} must divide each data-parallel rank's share of "
                         f"--train.global_batch_size {train.global_batch_size}: {share} examples")
    return ["--train.micro_batch_size", str(share // strategy.microbatches)]


def _dataclass_values(config: Any) -> list[Any]:
    """`config` and every dataclass nested in it."""
    nested = [getattr(config, f.name) for f in dataclasses.fields(config)]
    return [config] + [item for value in nested if dataclasses.is_dataclass(value) for item in _dataclass_values(value)]


def cmd_train(args: argparse.Namespace, rest: list[str]) -> None:
    if args.recipe is None:
        print(TRAIN_USAGE + "\nrecipes:\n" + "".join(f"  {name:18s} {r.description}\n" for name, r in recipes().items()))
        return
    recipe = get_recipe(args.recipe)
    if args.help:
        print(help_text(recipe.name, recipe.description, recipe.config_class()), end="")
        return
    rest = [*rest, *strategy_overrides(args, recipe.config_class())]
    config = apply_overrides(recipe.config_class(), _parse_overrides(rest))
    launched = "RANK" in os.environ  # a rank torchrun started: the world is torchrun's
    nproc = int(os.environ["WORLD_SIZE"]) if launched else args.nproc
    if args.microbatches is not None:  # launched ranks get the micro batch size it implies
        rest = [*rest, *microbatch_overrides(config, nproc)]
        config = apply_overrides(recipe.config_class(), _parse_overrides(rest))
    check_ranks(config, nproc)
    if args.nproc > 1 and not launched:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
                   "-m", "zoo.cli", "train", args.recipe, *rest]
        environment = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        raise SystemExit(subprocess.call(command, env=environment))
    from trainers.distributed import exit_process, shutdown_distributed

    recipe.run(config)
    shutdown_distributed()
    exit_process(0)


def cmd_export(args: argparse.Namespace) -> None:
    from zoo.hf import export_hf
    from zoo.store import load

    print(export_hf(load(args.name), args.directory))


BUILT_IN = ("list", "info", "train", "plan", "export")
"""The verbs of this module; the others come from the domains (`zoo.commands`)."""


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
    """The domain verbs the parser needs for `verb`: none for a built-in verb, that one alone for a
    domain's (so that only its domain is imported), and all of them otherwise (for --help, or an
    unknown verb's error that lists every choice)."""
    if verb in BUILT_IN:
        return []
    if verb in command_names():
        return [command_named(verb)]
    return list(domain_commands().values())


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser, with the domain verbs that `verb` needs (`verbs_to_load`)."""
    parser = argparse.ArgumentParser(prog="zoo", description="memzoo: train and use memory-lean models")
    parser.add_argument("--log-level", choices=LEVELS, default=None,
                        help="least severe log records shown (default: info, or $MEMZOO_LOG_LEVEL)")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="models and recipes")
    info = commands.add_parser("info", help="show a model's card")
    info.add_argument("name")
    # The recipe's own options come after its name; --help then lists them (see zoo.recipe_options).
    train = commands.add_parser("train", help="run a recipe: zoo train RECIPE [--field value ...] [--nproc N]",
                                add_help=False, usage=TRAIN_USAGE)
    train.add_argument("recipe", nargs="?")
    train.add_argument("-h", "--help", action="store_true", help="list the recipe's options")
    train.add_argument("--nproc", type=int, default=1, help="processes (ranks); >1 launches torchrun")
    train.add_argument("--tp", type=int, default=None,
                       help="tensor-parallel degree (--strategy.tp): ranks that split each layer; divides --nproc")
    train.add_argument("--sequence-parallel", action="store_true",
                       help="with --tp, split activations along the sequence too (--strategy.sequence_parallel)")
    train.add_argument("--pp", type=int, default=None,
                       help="pipeline-parallel degree (--strategy.pp): ranks that each run a slice of the blocks")
    train.add_argument("--pp-schedule", default=None, help="with --pp: gpipe, 1f1b, interleaved_1f1b, looped_bfs or "
                                                           "zero_bubble (--strategy.pp_schedule)")
    train.add_argument("--microbatches", type=int, default=None,
                       help="with --pp: micro batches per pipeline run (--strategy.microbatches)")
    train.add_argument("--offload", default=None, help="where model states live (--strategy.offload): none, "
                       "optimizer, params, or chunks (tiered memory, with --offload-dir and --memory)")
    train.add_argument("--offload-dir", default=None, help="with --offload chunks: the directory of the chunk files "
                       "(--strategy.offload_dir)")
    train.add_argument("--memory", default=None, help="memory budget, e.g. 4GiB (--strategy.memory_budget); with "
                       "--offload chunks: the whole process's resident memory")
    train.add_argument("--device-memory", default=None, help="with --offload chunks: device memory the chunks and "
                       "the step's device tensors may hold, e.g. 8GiB (--strategy.device_memory_budget; default on a "
                       "GPU: the memory free at the start)")
    train.add_argument("--swap-activations", default=None, help="with --offload chunks: saved activations of this "
                       "size and more go to files, e.g. 1MiB (--strategy.swap_activations)")
    train.add_argument("--stages-per-rank", type=int, default=None,
                       help="with --pp: pipeline stages on each rank (--strategy.stages_per_rank)")
    add_plan_arguments(commands.add_parser("plan", help="layouts that fit a memory budget, fastest first",
                                           usage=PLAN_USAGE))
    export = commands.add_parser("export", help="write a model as a Hugging Face folder (GPT-2, BERT)")
    export.add_argument("name")
    export.add_argument("directory")
    for command in verbs_to_load(verb):
        command.add_arguments(commands.add_parser(command.name, help=command.help))
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(requested_verb(argv))
    args, rest = parser.parse_known_args(argv)
    configure_logging(args.log_level)  # torchrun's ranks inherit the level through the environment
    try:
        if args.command == "train":
            cmd_train(args, rest)
            return
        if args.command == "plan":
            cmd_plan(args, _parse_overrides(rest))
            return
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        built_in = {"list": cmd_list, "info": cmd_info, "export": cmd_export}
        run = built_in[args.command] if args.command in built_in else command_named(args.command).run
        run(args)
    except (ValueError, OSError) as error:  # bad input, or a file the user named that cannot be used
        parser.exit(2, f"zoo: error: {error}\n")


if __name__ == "__main__":
    main()
