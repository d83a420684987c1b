"""`Strategy`: how a model is spread over devices and how much memory each rank keeps.

One spec for every zoo model. It names the mathematics (which ZeRO stage, where state lives, which
precision, what is recomputed); `trainers.parallelize` turns it into torch.distributed calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from trainers.estimate.devices import parse_bytes
from trainers.speed.precision import resolve_precision
from zoo.nn.cross_entropy import LossGradients

ZeroStage = Literal[0, 1, 2, 3]
Offload = Literal["none", "optimizer", "params", "chunks"]
Precision = Literal["fp32", "bf16", "fp16", "auto"]
Recompute = Literal["none", "blocks", "selective"]
Compile = Literal["none", "blocks", "model"]
PipelineSchedule = Literal["gpipe", "1f1b", "interleaved_1f1b", "looped_bfs", "zero_bubble"]
MULTI_STAGE_SCHEDULES = ("interleaved_1f1b", "looped_bfs")
"""Schedules that can run several pipeline stages on each rank (`Strategy.stages_per_rank` > 1);
interleaved 1F1B needs them (with one it is 1F1B), breadth-first also runs one per rank (the order
of GPipe, with breadth-first's data parallelism)."""


class LayoutRefused(ValueError):
    """The model cannot take this layout: a tensor-parallel degree that does not divide its heads
    or features, a pipeline it declares no split points for, more stages than blocks. The planner
    passes over such layouts; any other error of a traced layout is raised."""


@dataclass
class Strategy:
    """Memory strategy applied to any model by the `Trainer`.

    The ranks form the job's `DeviceMesh` (`trainers.parallel.mesh.DistEnv.mesh`) with dimensions
    ("pp", "dp", "tp"): `pp` ranks each run a slice of the model's blocks (pipeline stages), `tp`
    ranks split each layer, and world / (pp * tp) ranks hold the data-parallel replicas (or ZeRO
    shards) of each stage. The model is split for the pipeline first, then each stage for tensor
    parallelism, recompute and data parallelism.
    """

    zero: ZeroStage = 0
    """ZeRO stage. 0: plain data parallel (every rank holds parameters, gradients and optimizer
    state); 1: optimizer state sharded across ranks; 2: + gradients sharded (FSDP2 without
    resharding after forward); 3: + parameters sharded (FSDP2, resharded after forward)."""

    offload: Offload = "none"
    """Where state lives. "optimizer": fp32 master copies and optimizer state live on the CPU, and
    the optimizer step runs there; "params": parameters, gradients and optimizer state live on the
    CPU and each block is copied to the device when it runs (FSDP2 `CPUOffloadPolicy`); "chunks":
    parameters, gradients and AdamW moments live in chunks that move between memory and files in
    `offload_dir`, as many kept in memory as `memory_budget` leaves room for
    (`trainers.memory.chunks.states`; fp32, no tensor or pipeline parallelism; ZeRO 0: every
    data-parallel rank keeps all chunks, 3: each keeps and updates its share of them and gathers the
    others' parameter chunks as the model uses them). On a GPU the chunks in use are on the device,
    as many kept there as `device_memory_budget` leaves room for, the rest in pinned host memory and
    files."""

    offload_dir: str | None = None
    """Directory for the chunk files of offload="chunks" (each rank writes under rank<N>/ in it);
    needs room for the model states (16 bytes a parameter, divided by the ranks under ZeRO 3)."""

    precision: Precision = "fp32"
    """Compute precision of the blocks. Master parameters, gradient reduction and optimizer state
    stay fp32; "fp16" adds dynamic loss scaling that skips steps whose gradients overflow. "auto"
    becomes "bf16" where the training device computes it natively and "fp32" elsewhere, logged
    (`trainers.speed.precision`); the field then holds the choice."""

    recompute: Recompute = "none"
    """Activation recompute. "blocks": each block keeps only its input and recomputes the rest in
    backward; "selective": each block keeps the outputs of matrix multiplies and attention and
    recomputes the cheap element-wise ops. Selective pays off for unfused layers; `zoo.nn` blocks
    already keep no more than it would, so for them use "blocks" (or recompute_attention)."""

    loss_gradients: LossGradients = "forward"
    """When the fused losses (`zoo.nn.linear_cross_entropy`) form their gradients. "forward": three
    output-head products a step, the (vocabulary x width) float32 head gradient held from forward
    to backward; "backward": four (the logits formed again), nothing vocabulary-sized held between
    the passes. A vocabulary-parallel head forms them in forward either way (logged)."""

    compile: Compile = "none"
    """torch.compile (`trainers.speed.compile`). "blocks": each block of the model's plan compiled whole
    (fullgraph; a block that cannot be fails at its first forward, naming why); "model": the whole
    forward compiled, graph breaks allowed; "none" (or False): eager. The zoo's dropout draws the
    same masks compiled or not."""

    compile_backend: str = "inductor"
    """torch.compile's backend for `compile`: "inductor" generates fused kernels; "aot_eager"
    traces the same forward and backward graphs and runs them eagerly (no code generation: quick
    to start, for checking that a model compiles)."""

    tp: int = 1
    """Tensor-parallel degree: ranks that split each layer the model's plan names (attention heads,
    feed-forward columns, vocabulary rows; see `zoo.plan.ModelPlan`). Must divide the world size."""

    ep: int = 1
    """Expert-parallel degree: the data-parallel ranks form groups of `ep` consecutive ones, and each
    rank of a group holds 1/ep of every routed-experts module the model's plan names
    (`zoo.plan.ModelPlan.experts`), the tokens routed to the others' experts moving there and back
    by all-to-all (`trainers.parallel.experts`). The experts' parameters are sharded by ZeRO over
    the data-parallel ranks that hold the same experts (data-parallel ranks / ep), the others' over
    all data-parallel ranks. Must divide the data-parallel ranks and every experts module's count."""

    sequence_parallel: bool = False
    """Under tensor parallelism, also split the activations between the split layers (norms,
    dropout, residual adds) along the sequence, so each of the `tp` ranks keeps 1/tp of them:
    all-gather / reduce-scatter at the layers' edges instead of all-reduce. Needs tp > 1."""

    pp: int = 1
    """Pipeline-parallel degree: ranks that each hold a consecutive slice of the model's blocks
    (the first also the modules before them, the last those after them; see
    `zoo.plan.PipelineSplit`). Must divide the world size together with `tp`."""

    pp_schedule: PipelineSchedule = "1f1b"
    """Order in which each pipeline rank runs the forward and backward passes of the micro batches.
    "gpipe": all forwards, then all backwards (holds every micro batch's activations);
    "1f1b": after pp - rank warm-up forwards, one forward, one backward (holds at most pp);
    "interleaved_1f1b": 1F1B over `stages_per_rank` stages per rank placed in a loop (Megatron's
    virtual stages; the bubble shrinks by stages_per_rank); "looped_bfs": the same looping
    placement (or one stage per rank), each stage running all its micro batches breadth-first
    (Lamy-Poirier 2022), so a
    stage's data-parallel gradient reduction starts when its last backward ends and ZeRO-3
    gathers its parameters once per pass; "zero_bubble": 1F1B with each backward split into the
    input-gradient pass (on the critical path) and the weight-gradient pass (deferred into the
    bubbles; Qi et al. 2023, ZB-H1)."""

    microbatches: int | None = None
    """Micro batches per pipeline run. None: all of a step's micro batches (the global batch over
    TrainConfig.micro_batch_size and the data-parallel ranks) go through the pipeline in one run;
    a number must divide that count, and the step runs the pipeline count / microbatches times."""

    stages_per_rank: int = 1
    """Pipeline stages on each pipeline rank (virtual stages): the model's blocks are cut into
    pp * stages_per_rank stages, stage s placed on pipeline rank s % pp. Needs a schedule of
    `MULTI_STAGE_SCHEDULES` when > 1."""

    pp_split: tuple[int, ...] | None = None
    """Blocks of each pipeline stage, in stage order: pp * stages_per_rank counts of at least one,
    summing to the model's blocks (`zoo.plan.ModelPlan.blocks`). None: the stages balance each
    block's estimated cost on the example batch (`trainers.pipeline.balance`). The planner and the
    memory budget give the split they traced, so that the run is the one they estimated."""

    memory_budget: int | str | None = None
    """Bytes each rank's training step may hold at its peak: an int, or a string with a unit
    ("6GiB", "512 MiB"), kept as an int. The trainer then plans for its own model, world and batch
    (`trainers.estimate.budget`) and applies the cheapest way to stay under it: smaller chunks of the
    chunked operations, which operator outputs each block keeps for backward (the rest is
    recomputed), and, when that is not enough, a higher ZeRO stage (several data-parallel ranks)
    or offload (on a GPU). `recompute` is then chosen by the budget; `zero` and `offload` are
    where the search starts; the other fields stay. The first steps are measured, and a step
    that went over tightens the choice. None: no budget. Under offload="chunks" the budget is
    instead the whole process's resident memory (on a CPU machine), which the chunks in memory
    fill beside the step's other tensors; it is required there."""

    device_memory_budget: int | str | None = None
    """Under offload="chunks": bytes of device memory the chunks and the step's device tensors may
    hold at their peak (an int, or a string with a unit: "4GiB"), the device tier above host memory
    and disk (`trainers.memory.chunks.device`). None: on a GPU, the device memory free when training starts;
    on a CPU-only machine, no device tier. Given on a CPU-only machine, the device tier is a second
    pool of host memory under this budget, beside `memory_budget` (which then counts the process
    without it): the moves of all three tiers, on any machine."""

    swap_activations: int | str | None = None
    """Under offload="chunks": tensors that autograd saves for backward, of at least this many
    bytes (an int, or a string with a unit: "1MiB"), are swapped as forward saves them and brought
    back ahead of backward: under a device tier (a GPU, or `device_memory_budget`) from the device
    to host memory (pinned, copied on a side stream: `trainers.memory.activations.host`), else to
    files in `offload_dir` (`trainers.memory.activations.swap`); what a block saves at all follows
    `recompute`. None: activations stay where they are. Under `activation_memory` or
    `block_activations`: the size from which the swapping blocks' tensors go (None: all)."""

    activation_memory: int | str | None = None
    """Under offload="chunks": bytes of saved activations the model's blocks may keep in memory
    during a step (an int, or a string with a unit). A probe forward before the first step measures
    what each block saves and how long its forward takes; blocks keep their activations while they
    fit, and each other block swaps them (as `swap_activations` says where) or recomputes them from
    its input, whichever the probe found faster (`trainers.memory.activations.plan`). Needs
    recompute="none" (the choice is per block)."""

    block_activations: tuple[str, ...] | None = None
    """Under offload="chunks": each block's choice set by hand, "NAME=CHOICE" for every block of the
    model's plan, CHOICE one of keep, swap, recompute (`--strategy.block_activations
    blocks.0=keep,blocks.1=swap,...`). Needs recompute="none"; not with `activation_memory`."""

    def __post_init__(self) -> None:
        if self.compile is False:
            self.compile = "none"
        if self.precision in _CHOICES["precision"]:
            self.precision = resolve_precision(self.precision)
        if self.memory_budget is not None:
            self.memory_budget = parse_bytes(self.memory_budget, "Strategy.memory_budget")
        if self.device_memory_budget is not None:
            self.device_memory_budget = parse_bytes(self.device_memory_budget, "Strategy.device_memory_budget")
            if self.offload != "chunks":
                raise ValueError("Strategy.device_memory_budget sizes the device tier of offload='chunks'; "
                                 f"got offload={self.offload!r}")
        if self.swap_activations is not None:
            self.swap_activations = parse_bytes(self.swap_activations, "Strategy.swap_activations")
            if self.offload != "chunks":
                raise ValueError("Strategy.swap_activations writes activations beside the chunks of offload='chunks'; "
                                 f"got offload={self.offload!r}")
        self._check_block_activations()
        for name, allowed in _CHOICES.items():
            value = getattr(self, name)
            if isinstance(value, bool) or value not in allowed:
                raise ValueError(
                    f"Strategy.{name} must be one of {', '.join(map(repr, allowed))}; "
                    f"got {value!r}"
                )
        for name in ("tp", "pp", "ep", "stages_per_rank"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Strategy.{name} must be an integer >= 1; got {value!r}")
        if self.microbatches is not None and (isinstance(self.microbatches, bool)
                                              or not isinstance(self.microbatches, int) or self.microbatches < 1):
            raise ValueError(f"Strategy.microbatches must be None or an integer >= 1; got {self.microbatches!r}")
        if self.pp_schedule == "interleaved_1f1b" and self.pp > 1 and self.stages_per_rank == 1:
            raise ValueError(f"Strategy.pp_schedule={self.pp_schedule!r} runs several stages per rank and needs "
                             "Strategy.stages_per_rank > 1; got 1")
        if self.stages_per_rank > 1 and self.pp_schedule not in MULTI_STAGE_SCHEDULES:
            raise ValueError(f"Strategy.stages_per_rank={self.stages_per_rank} needs a schedule that runs several "
                             f"stages per rank ({', '.join(map(repr, MULTI_STAGE_SCHEDULES))}); "
                             f"got pp_schedule={self.pp_schedule!r}")
        if self.stages_per_rank > 1 and self.pp == 1:
            raise ValueError(f"Strategy.stages_per_rank={self.stages_per_rank} places stages on pipeline ranks "
                             "and needs Strategy.pp > 1; got pp=1")
        if self.pp_split is not None:
            self.pp_split = tuple(self.pp_split)
            stages = self.pp * self.stages_per_rank
            if self.pp == 1 or len(self.pp_split) != stages or any(
                    isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in self.pp_split):
                raise ValueError(f"Strategy.pp_split must give pp x stages_per_rank = {stages} block counts of at least "
                                 f"1 each (with pp > 1); got {self.pp_split!r}")
        if self.offload == "chunks":
            self._check_chunks()
        elif self.offload_dir is not None:
            raise ValueError(f"Strategy.offload_dir is for offload='chunks'; got offload={self.offload!r}")
        if not isinstance(self.sequence_parallel, bool):
            raise ValueError(f"Strategy.sequence_parallel must be True or False; got {self.sequence_parallel!r}")
        if self.ep > 1 and (self.offload == "chunks" or self.memory_budget is not None):
            raise ValueError(f"Strategy.ep={self.ep} runs over data-parallel ranks in memory, without a memory budget "
                             f"yet; got offload={self.offload!r}, memory_budget={self.memory_budget!r}")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("Strategy.sequence_parallel=True splits activations over the tensor-parallel ranks "
                             "and needs Strategy.tp > 1; got tp=1")


    def _check_block_activations(self) -> None:
        if self.activation_memory is not None:
            self.activation_memory = parse_bytes(self.activation_memory, "Strategy.activation_memory")
        chosen = {name: value for name, value in (("activation_memory", self.activation_memory),
                                                  ("block_activations", self.block_activations)) if value is not None}
        if not chosen:
            return
        if len(chosen) > 1 or self.offload != "chunks" or self.recompute != "none":
            raise ValueError("Strategy.activation_memory or Strategy.block_activations (one of them) chooses what each "
                             "block of offload='chunks' does with its activations, with recompute='none'; got "
                             f"{', '.join(f'{k}={v!r}' for k, v in chosen.items())}, offload={self.offload!r}, "
                             f"recompute={self.recompute!r}")
        if self.block_activations is not None:
            self.block_activations = tuple(self.block_activations)
            wrong = [entry for entry in self.block_activations
                     if not isinstance(entry, str) or entry.partition("=")[2] not in ("keep", "swap", "recompute")]
            if wrong:
                raise ValueError(f"Strategy.block_activations entries must read 'NAME=keep', 'NAME=swap' or "
                                 f"'NAME=recompute'; got {wrong}")

    def _check_chunks(self) -> None:
        if self.offload_dir is None or self.memory_budget is None:
            raise ValueError("Strategy.offload='chunks' needs Strategy.offload_dir (where chunks go) and "
                             f"Strategy.memory_budget (how much stays in memory); got offload_dir={self.offload_dir!r}, "
                             f"memory_budget={self.memory_budget!r}")
        if self.zero not in (0, 3):
            raise ValueError("Strategy.offload='chunks' runs with zero=0 (every rank keeps all chunks) or zero=3 "
                             f"(each rank its share); got zero={self.zero!r}")
        if self.compile != "none":
            raise ValueError("Strategy.offload='chunks' runs with compile='none': its parameters' numbers come and go "
                             "with their chunks, found through a torch-function mode at every operation, which a "
                             f"compiled graph would not see; got compile={self.compile!r}")
        others = {"tp": (self.tp, 1), "pp": (self.pp, 1), "precision": (self.precision, "fp32")}
        for name, (value, allowed) in others.items():
            if value != allowed:
                raise ValueError(f"Strategy.offload='chunks' runs with {name}={allowed!r}; got {name}={value!r}")


_CHOICES = {
    "zero": get_args(ZeroStage),
    "offload": get_args(Offload),
    "precision": get_args(Precision),
    "recompute": get_args(Recompute),
    "loss_gradients": get_args(LossGradients),
    "compile": get_args(Compile),
    "pp_schedule": get_args(PipelineSchedule),
}
