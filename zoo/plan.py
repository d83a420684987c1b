"""`ModelPlan`: what a model declares about itself so that `trainers/` can parallelise it.

Models hold no distributed code. A model declares, as patterns over its `named_modules()` names,
which modules are its repeated blocks (sharding and recompute units) and how its layers split
under tensor parallelism, and `trainers` applies the `Strategy` to them:

    def parallel_plan(self) -> ModelPlan:
        return ModelPlan(blocks=("blocks.*",), colwise=("blocks.*.fc1",), rowwise=("blocks.*.fc2",))

The tensor-parallel part is GSPMD's idea in Megatron's terms. A *region* is a module that runs on
this rank's shards: it is called with the whole activation (its first argument) and returns this
rank's partial sum of its output, which the trainer sums over the tensor-parallel group. Inside
it, column-parallel linears hold some of the output features (attention heads, feed-forward
columns), row-parallel ones the matching input features; their bias is added once, after the sum.
A column-/row-parallel linear outside every region is a region of its own: a column-parallel one
returns its shard of the features, the next row-parallel one takes it and returns the sum.

Under sequence parallelism the activations between regions are split along the sequence (dim 1):
`sequence_split` modules split their output (or `sequence_split_input` ones their input), regions
gather their input and reduce-scatter their output, `sequence_parallel` modules (norms) run on the
shards, and `sequence_gather` modules gather their output whole again.

Under pipeline parallelism the model's training forward is cut at its blocks (`PipelineSplit`).
A model without a `parallel_plan` method takes the plan its library ships (`zoo.library_plan`:
transformers' `tp_plan` and `pp_plan`), and without either trains as one unit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from dataclasses import fields as fields_of

import torch
from torch import nn

from zoo.library_plan import library_plan_fields
from zoo.module_patterns import matches


Carry = dict[str, torch.Tensor]
"""What flows from block to block under pipeline parallelism: the hidden states (floating-point
tensors that need gradients) and what every block also reads (masks, lengths, positions)."""


@dataclass(frozen=True)
class PipelineSplit:
    """How a model's training forward, `forward(**batch)["loss"]`, cuts into pipeline stages.

    The model defines three methods that together compute that loss:

        pipeline_enter(**batch) -> Carry            # the `pre` modules: batch to first carry
        pipeline_block(block, carry) -> Carry        # one of ModelPlan.blocks
        pipeline_exit(carry, **batch) -> loss        # the `post` modules: last carry to the loss

    `trainers` cuts the blocks into consecutive stages; the first stage also runs
    `pipeline_enter`, the last `pipeline_exit`, and each carry travels from stage to stage (every
    stage sees the whole batch, so labels need not travel). Every carry has the same keys.

    A model whose library names its pieces but whose own `forward` holds the code between them
    (transformers' decoders: positions, masks and rotary tables computed from the batch before the
    first block) defines none of the three methods and sets `through_forward`.
    """

    pre: tuple[str, ...] = ()
    """Modules `pipeline_enter` uses (embeddings), held by the first stage; also the names of
    buffers held directly by a module (feature statistics). Parameters must sit in a module named here."""
    post: tuple[str, ...] = ()
    """Modules (or buffers) `pipeline_exit` uses (final norm, head), held by the last stage. A
    module named in both `pre` and `post` (a word embedding that is also the output head) is held
    by both stages as two copies kept equal: their gradients are summed before each step."""
    attached: tuple[tuple[str, str], ...] = ()
    """(module, block) pairs: the module is held by the stage that holds the block, and
    `pipeline_block` runs it with that block (an encoder's final norm, after its last block)."""
    through_forward: bool = False
    """Each stage runs the model's own `forward(**batch)`, its blocks called one after another on a
    single hidden-state tensor (their first argument and their output), the modules of the other
    stages standing in: before this stage's first block they yield the carry {"hidden": (B, T, C)},
    into which that block's input is replaced; the stage ends at its last block's output, or with
    the forward's loss on the last stage. Every parameter lies in `pre`, a block or `post`."""


@dataclass(frozen=True)
class ModelPlan:
    """How a model splits, as patterns over `named_modules()` names, matched segment by segment
    with fnmatch ("blocks.*" matches "blocks.0" but not "blocks.0.attn")."""

    blocks: tuple[str, ...] = ()
    """The repeated blocks: each is one FSDP unit (its parameters gathered together) and one
    recompute unit."""
    recompute: tuple[str, ...] = ()
    """Further recompute units outside the blocks, whose activations are worth recomputing too (a
    convolutional front end): recomputed whenever the blocks are."""

    colwise: tuple[str, ...] = ()
    """`nn.Linear`s split by output features under tensor parallelism (attention q, k, v, the
    first feed-forward linear): weight and bias rows are sharded."""
    rowwise: tuple[str, ...] = ()
    """`nn.Linear`s split by input features (attention output, second feed-forward linear), each
    taking a column-parallel shard: weight columns are sharded, the bias is whole on every rank."""
    colwise_gathered: tuple[str, ...] = ()
    """`nn.Linear`s outside every region split by output features whose output is gathered whole
    again (an output head whose logits the model's own loss reads): its input enters whole."""
    replicated: tuple[str, ...] = ()
    """Modules whose own parameters stay whole on every tensor-parallel rank while they compute on
    this rank's shards (the one key/value head of multi-query attention, a learned gain, a norm over
    split heads), inside a region or between a column- and a row-parallel linear: each rank uses all
    of them on its part of the work, so their gradients are summed over the group. Every trainable
    parameter inside a region belongs to a split or a replicated module, or the plan is refused."""
    regions: tuple[str, ...] = ()
    """Modules that compute on tensor-parallel shards (attention, feed-forward): whole activation
    in (first argument), partial sum out. Each holds exactly one row-parallel linear, whose output
    is the region's."""
    heads: tuple[tuple[str, int], ...] = ()
    """(pattern, rows per head) of column-parallel or replicated linears whose output rows form
    heads: the tensor-parallel degree must divide their number of heads."""
    vocab_parallel: tuple[str, ...] = ()
    """`nn.Embedding`s split by vocabulary rows (a word embedding, and through the tied weight the
    output head): each rank looks up its rows, and the lookups are summed."""

    experts: tuple[str, ...] = ()
    """Modules of routed experts (`zoo.nn.moe.RoutedExperts`: matrices stacked along dim 0 by expert,
    their hidden-width dimensions in `HIDDEN_DIMS`, `compute` given them by name): under expert
    parallelism each rank holds a contiguous share of the experts, and the tokens routed to the
    others travel to them and back by all-to-all; under tensor parallelism they split by hidden
    width inside their region."""

    axial: tuple[str, ...] = ()
    """Modules run with axial parallelism (FastFold's dynamic axial parallelism): their tensor
    arguments are split along dim 1 over the tensor-parallel ranks on entry and their tensor
    outputs gathered whole on exit; inside, the module's `zoo.axial` annotations redistribute, and
    its parameters (whole on every rank) have their gradients summed over the ranks."""

    sequence_parallel: tuple[str, ...] = ()
    """Modules run on sequence shards under sequence parallelism (norms): their parameters'
    gradients are summed over the tensor-parallel group. Under sequence parallelism every trainable
    parameter of a block outside its regions belongs to one of them (or a split module), or the
    plan is refused."""
    sequence_split: tuple[str, ...] = ()
    """Modules whose output (B, S, ...) is split along S under sequence parallelism (embeddings)."""
    sequence_split_input: tuple[str, ...] = ()
    """Modules whose first argument (B, S, ...) is split along S as they are called, under sequence
    parallelism: the first block of a model whose own code computes positions and masks from the
    whole sequence before it (transformers' decoders)."""
    sequence_gather: tuple[str, ...] = ()
    """Modules whose output is gathered whole along S under sequence parallelism (the final norm)."""

    kept_whole: tuple[tuple[str, str], ...] = ()
    """(pattern, why) of modules the plan's source splits but this plan keeps whole on every
    tensor-parallel rank (an embedding with a padding row): logged when tensor parallelism applies."""
    tensor_parallel_refusals: tuple[str, ...] = ()
    """Why the model cannot run under tensor parallelism although its plan splits layers (a style of
    its library's plan that memzoo does not apply), each naming the module: raised under tp > 1."""

    pipeline: PipelineSplit | None = None
    """Where the model cuts into pipeline stages; None: it cannot run under pipeline parallelism."""

    chunk_memory: str | None = None
    """The field of the model's `config` holding the bytes one chunk of the model's own chunked
    operations may take at their largest intermediate (the Evoformer's attention and outer
    products, a sample-wise loss's joiner groups), read at each forward: a trainer holding a memory
    budget sets it. The fused layers of `zoo.nn` follow `zoo.nn.chunk_memory` instead."""

    def block_names(self, model: nn.Module) -> list[str]:
        """Names of the modules of `model` matched by `blocks`, in `named_modules()` order.

        Raises ValueError when a pattern matches nothing, so a renamed module cannot silently
        turn per-block sharding off."""
        return resolve(model, self.blocks, "blocks")

    def recompute_names(self, model: nn.Module) -> list[str]:
        """Names of the recompute units of `model`: the blocks, then the modules of `recompute`."""
        return self.block_names(model) + resolve(model, self.recompute, "recompute")

    @property
    def tensor_parallel(self) -> bool:
        """Whether the plan splits any layer under tensor parallelism."""
        return bool(self.colwise or self.rowwise or self.colwise_gathered or self.vocab_parallel or self.axial)

    def present_in(self, model: nn.Module) -> ModelPlan:
        """This plan without the patterns that match no module of `model`: the plan of a pipeline
        stage, whose other modules live on other ranks."""
        names = [name for name, _ in model.named_modules() if name]
        present = lambda pattern: any(matches(name, pattern) for name in names)  # noqa: E731
        fields = {f.name: tuple(p for p in getattr(self, f.name) if present(p)) for f in fields_of(self)
                  if f.name not in ("heads", "pipeline", "chunk_memory", "kept_whole", "tensor_parallel_refusals")}
        return replace(self, **fields, heads=tuple(h for h in self.heads if present(h[0])))

    def merged(self, other: ModelPlan) -> ModelPlan:
        """This plan's patterns and `other`'s, each once, in order (a stack of blocks of two shapes);
        `pipeline` and `chunk_memory` are this plan's where it has them, else `other`'s."""
        fields = {f.name: tuple(dict.fromkeys((*getattr(self, f.name), *getattr(other, f.name))))
                  for f in fields_of(self) if f.name not in ("pipeline", "chunk_memory")}
        return replace(self, **fields, pipeline=self.pipeline or other.pipeline,
                       chunk_memory=self.chunk_memory or other.chunk_memory)

    def names(self, model: nn.Module, field: str) -> list[str]:
        """Names of `model`'s modules matched by the patterns of `field` (a tuple-of-patterns field),
        after checking the module types the field requires; ValueError naming the field otherwise."""
        found = resolve(model, getattr(self, field), field)
        wanted = _REQUIRED_TYPES.get(field)
        if wanted is not None:
            modules = dict(model.named_modules())
            for name in found:
                if not isinstance(modules[name], wanted):
                    raise ValueError(f"ModelPlan.{field} names {name!r}, a {type(modules[name]).__name__}; "
                                     f"it must name {wanted.__name__} modules")
        return found

    def head_rows(self, model: nn.Module) -> dict[str, int]:
        """{linear name: rows per head} from `heads`."""
        rows: dict[str, int] = {}
        for pattern, size in self.heads:
            if size < 1:
                raise ValueError(f"ModelPlan.heads gives {pattern!r} {size} rows per head; it must be >= 1")
            rows.update(dict.fromkeys(resolve(model, (pattern,), "heads"), size))
        return rows


_REQUIRED_TYPES = {"colwise": nn.Linear, "rowwise": nn.Linear, "colwise_gathered": nn.Linear,
                   "vocab_parallel": nn.Embedding}


def resolve(model: nn.Module, patterns: tuple[str, ...], field: str) -> list[str]:
    """Names of `model`'s modules matched by `patterns`, in `named_modules()` order; ValueError
    naming `field` when a pattern matches nothing."""
    names = [name for name, _ in model.named_modules() if name]
    matched: set[str] = set()
    for pattern in patterns:
        hits = [name for name in names if matches(name, pattern)]
        if not hits:
            raise ValueError(
                f"ModelPlan.{field} pattern {pattern!r} matches no submodule of "
                f"{type(model).__name__}; its top-level children are {[n for n, _ in model.named_children()]}"
            )
        matched.update(hits)
    return [name for name in names if name in matched]


def model_plan(model: nn.Module) -> ModelPlan:
    """The plan `model` declares, else the plan its library ships (`zoo.library_plan`), else an
    empty plan (the whole model is one unit)."""
    declare = getattr(model, "parallel_plan", None)
    if declare is None:
        shipped = library_plan_fields(model)
        if shipped is None:
            return ModelPlan()
        pipeline = shipped.pop("pipeline", None)
        return ModelPlan(**shipped, pipeline=None if pipeline is None else PipelineSplit(**pipeline, through_forward=True))
    plan = declare()
    if not isinstance(plan, ModelPlan):
        raise TypeError(
            f"{type(model).__name__}.parallel_plan() must return zoo.plan.ModelPlan; got {type(plan).__name__}"
        )
    return plan
