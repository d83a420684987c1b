"""The parallel plan a model's own library ships, as `zoo.plan.ModelPlan` fields: transformers'.

A `transformers` model (5.x) carries its plans on the instance: `tp_plan` ({module pattern: style},
the class's own entries such as the output head beside its config's `base_model_tp_plan`, already
prefixed with the base model's name) and `pp_plan` ({module: (inputs, outputs)}, from
`base_model_pp_plan`). A 4.x model carries only the config's, read here under `base_model_prefix`.
This module reads those plans; it imports no transformers code (the model is duck-typed) and builds
no `ModelPlan` itself (`zoo.plan.model_plan` does, so that the two modules need no import cycle).

Each transformers style becomes a field or a refusal:

    colwise                          colwise (the output: this rank's features)
    rowwise                          rowwise (the input: this rank's features; the output summed)
    colwise_gather_output, colwise_rep   colwise_gathered (the output gathered whole: a head)
    embedding_rowwise                vocab_parallel, except an embedding with a padding row or one
                                     whose weight another module shares (tied to the head): kept
                                     whole, with the head it is tied to (`kept_whole` says why)
    replicated_with_grad_allreduce   replicated (whole on every rank, gradients summed)
    sequence_parallel                sequence_parallel
    replicate                        nothing (whole on every rank, as every unnamed module)
    any other                        a refusal naming the module and the style
                                     (`tensor_parallel_refusals`), raised only under tensor
                                     parallelism: the blocks still serve ZeRO and recompute

The blocks are the `pp_plan` modules that are `nn.ModuleList`s (each element a block); a model
without a `pp_plan` takes the elements of its `ModuleList`s whose class `_no_split_modules` names
(transformers' own "keep this module on one device"). Linears of the attention modules (those with a
`head_dim` or `head_size`) split by heads of that many rows.

The module holding each row-parallel linear and the column-parallel ones before it (an attention, a
feed-forward) becomes a region: its input enters whole, its output leaves summed, so the model's
code inside sees whole tensors of the whole sequence. Under sequence parallelism the sequence splits
at the first block's input (the model's code computes positions and masks from the whole sequence
before it) and is gathered after the module `pp_plan` names after the blocks (the final norm);
the blocks' norms and that one run on the shards (`sequence_parallel`).

Pipeline stages cut the pipeline plan's module list; the modules before it go with the first stage,
those after it (the final norm, the head) with the last, and each stage runs the model's own forward
(`PipelineSplit.through_forward`), which computes what the blocks read besides the hidden states.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from zoo.module_patterns import matches

STYLE_FIELDS = {"colwise": "colwise", "rowwise": "rowwise", "colwise_gather_output": "colwise_gathered",
                "colwise_rep": "colwise_gathered", "embedding_rowwise": "vocab_parallel",
                "replicated_with_grad_allreduce": "replicated", "sequence_parallel": "sequence_parallel"}
"""transformers' tensor-parallel styles and the `ModelPlan` field each becomes."""
WHOLE_STYLES = ("replicate",)
"""Styles that keep a module whole on every rank, as a plan that names nothing does."""
REFUSED_STYLES = {
    "rowwise_rep": "its input enters whole and is split on entry",
    "rowwise_split_input": "its input enters whole and is split on entry",
    "embedding_colwise": "it splits the embedding's width",
    "packed_colwise": "its weight packs several projections along the output",
    "packed_rowwise": "its weight packs several projections along the input",
    "unit_colwise": "it splits whole units (heads) of uneven count",
    "unit_rowwise": "it splits whole units (heads) of uneven count",
    "local_colwise": "it computes on local tensors the model's code redistributes itself",
    "local_rowwise": "it computes on local tensors the model's code redistributes itself",
    "local_params": "it computes on local tensors the model's code redistributes itself",
    "local": "it computes on local tensors the model's code redistributes itself",
    "gather": "it gathers an output the model's code expects split",
    "isolate": "it keeps a module out of the tensor-parallel group",
    "all_reduce": "it sums a module's partial output where the plan places it",
    "mla_kv_a_proj": "multi-head latent attention's compressed projection",
    "moe_tp_experts": "routed experts split by hidden width inside the model's own code",
    "grouped_gemm": "routed experts stacked for a grouped product (expert parallelism)",
    "ep_dispatch_experts": "routed experts dispatched by the model's own code (expert parallelism)",
    "ep_router": "a router dispatching tokens by the model's own code (expert parallelism)",
}
"""Styles memzoo does not apply, each with why: a plan naming one is refused under tensor parallelism."""


def library_plan_fields(model: nn.Module) -> dict[str, tuple[Any, ...]] | None:
    """`ModelPlan` keyword arguments from the plans `model`'s library ships, or None when it ships
    none (not a transformers model, or one with neither a tensor- nor a pipeline-parallel plan)."""
    tp_plan, pp_plan = _plans(model)
    if not tp_plan and not pp_plan and not getattr(model, "_no_split_modules", None):
        return None
    names = [name for name, _ in model.named_modules() if name]
    modules = dict(model.named_modules())
    fields: dict[str, list[Any]] = {}
    shared = _shared_weights(model)
    for pattern, style in tp_plan.items():
        if not any(matches(name, pattern) for name in names):
            continue  # transformers' plans name modules a configuration may leave out (a class's own head)
        field = STYLE_FIELDS.get(style)
        if style in WHOLE_STYLES:
            continue
        if field is None:
            why = REFUSED_STYLES.get(style, "memzoo does not know it")
            fields.setdefault("tensor_parallel_refusals", []).append(
                f"{pattern!r} is {style!r} in {type(model).__name__}'s tensor-parallel plan: {why}")
            continue
        if field in ("vocab_parallel", "colwise_gathered"):
            matched = [modules[name] for name in names if matches(name, pattern)]
            whole = _kept_whole(matched, shared)
            if whole:
                fields.setdefault("kept_whole", []).append((pattern, whole))
                continue
        fields.setdefault(field, []).append(pattern)
    blocks = _blocks(model, pp_plan, modules)
    heads = [(pattern, rows) for pattern in fields.get("colwise", []) if (rows := _head_rows(model, pattern, names))]
    plan = {key: tuple(value) for key, value in fields.items()}
    regions = _regions(plan.get("colwise", ()), plan.get("rowwise", ()))
    pipeline = _pipeline(model, pp_plan, modules)
    sequence = _sequence_fields(model, pipeline, blocks, {**plan, "regions": regions}) if regions and pipeline else {}
    return {**plan, **sequence, "regions": regions, "blocks": tuple(blocks), "heads": tuple(heads),
            "pipeline": pipeline}


def _pipeline(model: nn.Module, pp_plan: dict[str, Any], modules: dict[str, nn.Module]) -> dict[str, tuple[str, ...]] | None:
    """`PipelineSplit` fields from the pipeline plan: the modules before its one module list (`pre`:
    the embeddings) and after it (`post`: the final norm, then the class's own head), in the order
    the forward runs them; None without a pipeline plan of one module list. The base model's plan is
    in that order; the entries a class adds (its head) run on the base model's output."""
    root = _base_root(model)
    base = [root + name for name in (getattr(getattr(model, "config", None), "base_model_pp_plan", None) or {})]
    order = [name for name in base if name in pp_plan] + [name for name in pp_plan if name not in base]
    order = [name for name in order if name in modules]
    lists = [name for name in order if isinstance(modules[name], nn.ModuleList)]
    if len(lists) != 1:
        return None
    at = order.index(lists[0])
    return {"pre": tuple(order[:at]), "post": tuple(order[at + 1:])}


def _regions(colwise: tuple[str, ...], rowwise: tuple[str, ...]) -> tuple[str, ...]:
    """The module holding each row-parallel linear and the column-parallel ones before it (an
    attention, a feed-forward), when every row-parallel one has such a parent of its own: its input
    enters whole and its output leaves summed (under sequence parallelism: gathered and
    reduce-scattered around the whole module, whose code sees the whole sequence)."""
    parents = [pattern.rpartition(".")[0] for pattern in rowwise]
    if not all(parents) or len(set(parents)) != len(parents):
        return ()
    if not all(any(c.startswith(parent + ".") for c in colwise) for parent in parents):
        return ()
    return tuple(parents)


def _sequence_fields(model: nn.Module, pipeline: dict[str, tuple[str, ...]], blocks: list[str],
                     plan: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Where the sequence splits under sequence parallelism: at the first block's input (the model's
    code computes positions and masks before it from the whole sequence), gathered after the module
    the pipeline plan names after the blocks (the final norm); the norms of the blocks and that one
    run on sequence shards. Empty where the model has no such final module."""
    if len(blocks) != 1 or not pipeline["post"]:
        return {}
    stack = blocks[0].removesuffix(".*")
    final = pipeline["post"][0]
    covered = {p for field in ("colwise", "rowwise", "replicated", "regions") for p in plan.get(field, ())}
    first = f"{stack}.0"
    inside = [name[len(first) + 1:] for name, module in model.get_submodule(first).named_modules(prefix=first)
              if name != first and any(p.requires_grad for p in module.parameters(recurse=False))]
    norms = tuple(f"{stack}.*.{name}" for name in inside
                  if not any(matches(f"{first}.{name}", p) or matches(f"{first}.{name}", p + ".*") for p in covered)
                  and not any(f"{stack}.*.{name}".startswith(region + ".") for region in plan.get("regions", ())))
    return {"sequence_split_input": (first,), "sequence_gather": (final,), "sequence_parallel": (*norms, final)}


def _plans(model: nn.Module) -> tuple[dict[str, str], dict[str, Any]]:
    """({pattern: style}, {module: (inputs, outputs)}) of a transformers model, patterns rooted at it."""
    tp_plan, pp_plan = getattr(model, "tp_plan", None), getattr(model, "pp_plan", None)
    if isinstance(tp_plan, dict) and isinstance(pp_plan, dict):
        return dict(tp_plan), dict(pp_plan)
    config, root = getattr(model, "config", None), _base_root(model)
    tp_plan = getattr(config, "base_model_tp_plan", None) or {}
    pp_plan = getattr(config, "base_model_pp_plan", None) or {}
    return ({root + k: v for k, v in tp_plan.items()}, {root + k: v for k, v in pp_plan.items()})


def _base_root(model: nn.Module) -> str:
    """The prefix of the base model's module names in `model` ("model." in a causal LM), or ""."""
    prefix = getattr(model, "base_model_prefix", "")
    return f"{prefix}." if prefix and isinstance(getattr(model, prefix, None), nn.Module) else ""


def _blocks(model: nn.Module, pp_plan: dict[str, Any], modules: dict[str, nn.Module]) -> list[str]:
    """Patterns of the repeated blocks: the pipeline plan's module lists, else the elements of module
    lists whose class transformers keeps on one device."""
    lists = [name for name in pp_plan if isinstance(modules.get(name), nn.ModuleList)]
    if lists:
        return [f"{name}.*" for name in lists]
    kept = set(getattr(model, "_no_split_modules", None) or ())
    return [f"{name}.*" for name, module in modules.items()
            if name and isinstance(module, nn.ModuleList) and module and all(type(m).__name__ in kept for m in module)]


def _shared_weights(model: nn.Module) -> set[int]:
    """ids of the parameters more than one module holds (a word embedding tied to the output head)."""
    owners: dict[int, int] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            owners[id(param)] = owners.get(id(param), 0) + 1
    return {key for key, count in owners.items() if count > 1}


def _kept_whole(matched: list[nn.Module], shared: set[int]) -> str | None:
    """Why the embeddings or heads `matched` stay whole on every rank, or None when they split."""
    if any(id(module.weight) in shared for module in matched):
        return "its weight is tied to another module's (the word embedding and the output head stay whole together)"
    if any(getattr(module, "padding_idx", None) is not None for module in matched):
        return "it has a padding row, whose zero gradient a vocabulary split would misplace"
    return None


def _head_rows(model: nn.Module, pattern: str, names: list[str]) -> int | None:
    """Rows per head of the column-parallel linears of `pattern`: the `head_dim` (or `head_size`) of
    the attention module holding them, None outside attention."""
    first = next(name for name in names if matches(name, pattern))
    parent = model.get_submodule(first.rpartition(".")[0]) if "." in first else model
    rows = getattr(parent, "head_dim", None) or getattr(parent, "head_size", None)
    return rows if isinstance(rows, int) and rows > 0 else None
