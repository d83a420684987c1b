"""`zoo train RECIPE [--nproc N] [--field value ...]`: run a recipe, on N ranks through torchrun.

The recipe's own options come after its name (`zoo train RECIPE --help` lists them,
`zoo.recipe_options`); the strategy flags (--tp, --pp, --offload, ...) stand for its
`strategy.*` options. Every rank count and batch split is checked before any process starts.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import subprocess
import sys
from typing import Any

from trainers.config import TrainConfig
from trainers.loop.data import check_batch_sizes, pipeline_microbatches
from trainers.parallel.mesh import exit_process, shutdown_distributed
from trainers.pipeline.schedules import check_schedule
from trainers.speed.precision import unannounced
from trainers.strategy import Strategy
from zoo.commands import Command
from zoo.recipe_options import help_text, options
from zoo.recipes import apply_overrides, get_recipe, parse_overrides, recipes

TRAIN_USAGE = ("zoo train RECIPE [--nproc N] [--tp T [--sequence-parallel]] [--ep E] [--pp P [--pp-schedule S] "
               "[--microbatches M] [--stages-per-rank V]] [--offload chunks --offload-dir DIR --memory BYTES "
               "[--device-memory BYTES] [--swap-activations BYTES]] [--compile blocks|model] [--OPTION VALUE ...]   (zoo train RECIPE --help lists its options)")


def check_ranks(config: Any, nproc: int) -> None:
    """Before any process starts: --nproc must be a multiple of the strategy's tensor- and
    pipeline-parallel degrees whose data-parallel ranks the expert-parallel degree divides, and split every TrainConfig's global batch into whole micro batches
    per data-parallel rank (and those into the pipeline's runs, which its schedule must take);
    more ranks than cores is allowed, with a warning."""
    values = _dataclass_values(config)
    strategy = next((value for value in values if isinstance(value, Strategy)), Strategy())
    tp, pp = strategy.tp, strategy.pp
    if nproc % tp:
        raise ValueError(f"--nproc {nproc} must be a multiple of the tensor-parallel degree --tp {tp}")
    if nproc % (tp * pp):
        raise ValueError(f"--nproc {nproc} must be a multiple of --pp {pp} x --tp {tp} = {pp * tp}")
    if (nproc // (tp * pp)) % strategy.ep:
        raise ValueError(f"--ep {strategy.ep} must divide the data-parallel ranks, --nproc {nproc} / (--pp {pp} x "
                         f"--tp {tp}) = {nproc // (tp * pp)}")
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


STRATEGY_FLAGS = {"tp": "strategy.tp", "ep": "strategy.ep", "pp": "strategy.pp", "pp_schedule": "strategy.pp_schedule",
                  "microbatches": "strategy.microbatches", "stages_per_rank": "strategy.stages_per_rank",
                  "offload": "strategy.offload", "offload_dir": "strategy.offload_dir", "memory": "strategy.memory_budget",
                  "device_memory": "strategy.device_memory_budget", "swap_activations": "strategy.swap_activations",
                  "compile": "strategy.compile"}
"""`zoo train` flags that stand for recipe options of the strategy (with --sequence-parallel)."""


def strategy_overrides(args: argparse.Namespace, config: Any) -> list[str]:
    """--tp, --sequence-parallel, --ep, --pp, --pp-schedule, --microbatches, --stages-per-rank, --offload,
    --offload-dir, --memory, --device-memory, --swap-activations and --compile as the recipe options they stand for
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


def run_train(args: argparse.Namespace) -> None:
    rest = args.words
    if args.recipe is None:
        print(TRAIN_USAGE + "\nrecipes:\n" + "".join(f"  {name:18s} {r.description}\n" for name, r in recipes().items()))
        return
    recipe = get_recipe(args.recipe)
    if args.help:
        print(help_text(recipe.name, recipe.description, recipe.config_class()), end="")
        return
    if args.nproc < 1:
        raise ValueError(f"--nproc must be >= 1; got {args.nproc}")
    launched = "RANK" in os.environ  # a rank torchrun started: the world is torchrun's
    with unannounced() if args.nproc > 1 and not launched else contextlib.nullcontext():  # the ranks will say
        rest = [*rest, *strategy_overrides(args, recipe.config_class())]
        config = apply_overrides(recipe.config_class(), parse_overrides(rest))
    nproc = int(os.environ["WORLD_SIZE"]) if launched else args.nproc
    if args.microbatches is not None:  # launched ranks get the micro batch size it implies
        rest = [*rest, *microbatch_overrides(config, nproc)]
        config = apply_overrides(recipe.config_class(), parse_overrides(rest))
    check_ranks(config, nproc)
    if args.nproc > 1 and not launched:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
                   "-m", "zoo.cli", "train", args.recipe, *rest]
        environment = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        raise SystemExit(subprocess.call(command, env=environment))
    recipe.run(config)
    shutdown_distributed()
    exit_process(0)


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", nargs="?")
    parser.add_argument("-h", "--help", action="store_true", help="list the recipe's options")
    parser.add_argument("--nproc", type=int, default=1, help="processes (ranks); >1 launches torchrun")
    parser.add_argument("--tp", type=int, default=None,
                       help="tensor-parallel degree (--strategy.tp): ranks that split each layer; divides --nproc")
    parser.add_argument("--sequence-parallel", action="store_true",
                       help="with --tp, split activations along the sequence too (--strategy.sequence_parallel)")
    parser.add_argument("--ep", type=int, default=None,
                       help="expert-parallel degree (--strategy.ep): data-parallel ranks that share out each layer's "
                            "routed experts")
    parser.add_argument("--pp", type=int, default=None,
                       help="pipeline-parallel degree (--strategy.pp): ranks that each run a slice of the blocks")
    parser.add_argument("--pp-schedule", default=None, help="with --pp: gpipe, 1f1b, interleaved_1f1b, looped_bfs or "
                                                           "zero_bubble (--strategy.pp_schedule)")
    parser.add_argument("--microbatches", type=int, default=None,
                       help="with --pp: micro batches per pipeline run (--strategy.microbatches)")
    parser.add_argument("--offload", default=None, help="where model states live (--strategy.offload): none, "
                       "optimizer, params, or chunks (tiered memory, with --offload-dir and --memory)")
    parser.add_argument("--offload-dir", default=None, help="with --offload chunks: the directory of the chunk files "
                       "(--strategy.offload_dir)")
    parser.add_argument("--memory", default=None, help="memory budget, e.g. 4GiB (--strategy.memory_budget); with "
                       "--offload chunks: the whole process's resident memory")
    parser.add_argument("--device-memory", default=None, help="with --offload chunks: device memory the chunks and "
                       "the step's device tensors may hold, e.g. 8GiB (--strategy.device_memory_budget; default on a "
                       "GPU: the memory free at the start)")
    parser.add_argument("--swap-activations", default=None, help="with --offload chunks: saved activations of this "
                       "size and more go to files (to host memory from a device), e.g. 1MiB "
                       "(--strategy.swap_activations)")
    parser.add_argument("--compile", default=None, help="torch.compile (--strategy.compile): blocks (each block of "
                       "the model's plan, whole) or model (the whole forward)")
    parser.add_argument("--stages-per-rank", type=int, default=None,
                       help="with --pp: pipeline stages on each rank (--strategy.stages_per_rank)")


TRAIN = Command("train", "run a recipe: zoo train RECIPE [--field value ...] [--nproc N]", add_train_arguments,
                run_train, parser_options={"add_help": False, "usage": TRAIN_USAGE}, open_ended=True)
