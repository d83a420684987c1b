"""`zoo plan MODEL --nproc N --memory 80GiB [--device h100]`: the layouts of a model that fit a
memory budget per device, fastest first, with the `zoo train` flags that run each (see
`trainers.estimate.planner`). MODEL is a stored model (its config) or an architecture name; `--FIELD VALUE`
after it sets the architecture's config fields (`zoo plan gpt --n_layer 32 --n_embd 4096 ...`).
The architecture's `example_batch(config, rows)` makes the micro batch that is traced. MODEL may
also be a transformers model folder: the class its config.json names is planned under the plans
transformers ships with it (`zoo.transformers_folder`), on `--sequence-length` tokens a row."""

from __future__ import annotations

import argparse
import functools
from typing import Any

from trainers.estimate.planner import plan
from zoo import transformers_folder
from zoo.commands import Command
from zoo.hf import is_hf_folder
from zoo.recipes import apply_overrides, parse_overrides
from zoo.registry import get_architecture
from zoo.store import list_models, read_config

PLAN_USAGE = ("zoo plan MODEL --nproc N --memory BYTES [--device h100|a100|cpu] [--micro-batch-size M] "
              "[--global-batch-size G] [--sequence-length L] [--top K] [--max-traces T] [--FIELD VALUE ...]")


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a stored model, an architecture name (zoo list) or a transformers model folder")
    parser.add_argument("--nproc", type=int, required=True, help="devices (ranks) of the job")
    parser.add_argument("--memory", required=True, help="memory budget per device, e.g. 80GiB")
    parser.add_argument("--device", default="cpu", help="h100, a100 (presets) or cpu (measured here); default cpu")
    parser.add_argument("--micro-batch-size", type=int, default=1, help="the largest micro batch to consider")
    parser.add_argument("--global-batch-size", type=int, default=None,
                        help="examples per optimizer step (default: micro batch size x nproc)")
    parser.add_argument("--sequence-length", type=int, default=1024,
                        help="tokens a row of a transformers language model's micro batch (default 1024)")
    parser.add_argument("--top", type=int, default=5, help="plans to print")
    parser.add_argument("--max-traces", type=int, default=4,
                        help="layouts traced at most (about 10 s each for a 7B GPT on 2 cores)")


def cmd_plan(args: argparse.Namespace, overrides: dict[str, str]) -> None:
    if args.micro_batch_size < 1:
        raise ValueError(f"--micro-batch-size must be >= 1; got {args.micro_batch_size}")
    if is_hf_folder(args.model):
        if overrides:
            raise ValueError(f"{args.model!r} is a transformers model folder: set {', '.join(overrides)} in its "
                             "config.json")
        if args.sequence_length < 1:
            raise ValueError(f"--sequence-length must be >= 1; got {args.sequence_length}")
        build = transformers_folder.builder(args.model)
        batch = transformers_folder.example_batch(args.model, args.micro_batch_size, args.sequence_length)
    else:
        architecture, config = _model_config(args.model, overrides)
        make_batch = getattr(architecture.model_class, "example_batch", None)
        if make_batch is None:
            raise ValueError(f"architecture {architecture.name!r} has no example_batch(config, rows); zoo plan cannot "
                             "make its micro batch")
        build, batch = functools.partial(architecture.model_class, config), make_batch(config, args.micro_batch_size)
    plans = plan(build, batch, args.nproc, args.memory, args.device, args.global_batch_size, top=args.top,
                 max_traces=args.max_traces)
    print(plan_table(plans))


def _model_config(model: str, overrides: dict[str, str]) -> tuple[Any, Any]:
    stored = list_models()
    if model in stored:
        saved = read_config(stored[model])
        architecture = get_architecture(saved["arch"])
        config = architecture.config_class(**saved["config"])
    else:
        architecture = get_architecture(model)
        config = architecture.config_class()
    return architecture, apply_overrides(config, overrides) if overrides else config


def plan_table(plans: list) -> str:
    """The plans as a Markdown table: per-rank memory at the peak by category (GiB, or MiB when
    every peak is below one GiB), the step time by part, and the flags."""
    unit, scale = ("GiB", 2**30) if max(p.peak for p in plans) >= 2**30 else ("MiB", 2**20)
    lines = [f"| # | peak {unit} | parameters | gradients | optimizer | activations + temporaries | step s | compute | "
             "tensor-parallel | data-parallel | offload | pipeline | zoo train flags |", "|" + "---|" * 13]
    for index, p in enumerate(plans, 1):
        parts = p.estimate.at_peak()
        t = p.time
        lines.append(f"| {index} | {p.peak / scale:.2f} | {parts['parameters'] / scale:.2f} | "
                     f"{parts['gradients'] / scale:.2f} | {parts['optimizer'] / scale:.2f} | "
                     f"{(parts['activations'] + parts['temporaries']) / scale:.2f} | "
                     f"{t.total:.3f} | {t.compute:.3f} | {t.tensor_parallel:.3f} | {t.data_parallel:.3f} | "
                     f"{t.offload:.3f} | {t.pipeline:.3f} | `{p.train_flags()}` |")
    return "\n".join(lines)


PLAN = Command("plan", "layouts that fit a memory budget, fastest first", add_plan_arguments,
               lambda args: cmd_plan(args, parse_overrides(args.words)), parser_options={"usage": PLAN_USAGE},
               open_ended=True)
